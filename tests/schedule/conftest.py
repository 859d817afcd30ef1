"""Make the shared PDG builders (``schedule_pdgs``) importable whatever pytest's import mode."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

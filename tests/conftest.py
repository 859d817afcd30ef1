"""Test-suite settings: verify the PDG after every compiler pass (``timerl.compile.build_pdg``)."""

from __future__ import annotations

import os

os.environ.setdefault("TIMERL_VERIFY_PASSES", "1")

# n-step REINFORCE: returns over t:min(t+n, T). The scheduler interleaves learning
# with acting (TimeRL §8.4). Same program as examples/reinforce.py with --n set.
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from reinforce import Args, main, parse_args  # noqa: E402

if __name__ == "__main__":
    main(parse_args(Args(n=5)))

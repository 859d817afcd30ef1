# n-step REINFORCE: returns over t:min(t+n, T). The scheduler interleaves learning
# with acting (TimeRL §8.4): learning for step t runs n-1 steps after acting at t.
# Same program as examples/reinforce.py with --n set. The default n=20 learns CartPole
# reliably; n=5 gives a weak signal (the truncated return is the same constant except
# in the last 5 steps of an episode).
from __future__ import annotations

from reinforce import Args, main, parse_args  # examples/reinforce.py, beside this file

if __name__ == "__main__":
    main(parse_args(Args(n=20)))

"""How much a LoopTune schedule can gain on this CPU: GFLOPS of the untuned nest and of a
few hand-written action sequences (register tiles), timed with the TVM measurer, per problem.

    python benchmarks/looptune_headroom.py [--problems mm_64x64x64,mm_256x256x256]

Ratios are against the untuned nest measured in the same process.
"""

from __future__ import annotations

import argparse

from timerl.envs.looptune.ir import ACTIONS, Problem, apply_action, initial_state
from timerl.envs.looptune.measure import TVMMeasurer, numpy_gflops

SEQUENCES = {
    "m2 below k": ["split_2", "down", "swap_down"],
    "m4 below k": ["split_4", "down", "swap_down"],
    "m4 x n16 tile": ["split_4", "down", "swap_down", "down", "split_16", "swap_up", "swap_up"],
    "m8 x n16 tile": ["split_8", "down", "swap_down", "down", "split_16", "swap_up", "swap_up"],
    "m4 x n32 tile": ["split_4", "down", "swap_down", "down", "split_32", "swap_up", "swap_up"],
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--problems", default="mm_64x64x64,mm_128x128x128,mm_256x256x256,mm_96x160x176,mm_208x112x240"
    )
    args = ap.parse_args()
    meas = TVMMeasurer()
    for name in args.problems.split(","):
        p = _problem(name)
        base = meas.gflops(initial_state(p))
        cells = [f"untuned {base:6.1f}", f"numpy {numpy_gflops(p):6.1f}"]
        for label, seq in SEQUENCES.items():
            s = initial_state(p)
            for a in seq:
                s = apply_action(s, ACTIONS.index(a))
            g = meas.gflops(s)
            cells.append(f"{label} {g:6.1f} ({g / base:.2f}x)")
        print(f"{name}: " + ", ".join(cells), flush=True)


def _problem(name: str) -> Problem:
    m, n, k = (int(x) for x in name.removeprefix("mm_").split("x"))
    return Problem(m, n, k)


if __name__ == "__main__":
    main()

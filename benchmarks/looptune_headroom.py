"""How much a LoopTune schedule can gain on this CPU: GFLOPS of the untuned nest and of
hand-written action sequences (register tiles ``m/a, n/b, k, m_a, n_b``), timed with the
TVM measurer, per problem; the best one per problem, and whether its splits leave tails
(remainder loops, see :mod:`timerl.envs.looptune.tvm_lower`).

    python benchmarks/looptune_headroom.py [--problems mm_64x64x64,mm_256x256x256]
        [--max-lanes 64] [--unroll 0] [--sequences m8xn32,m4xn64]

``--max-lanes`` / ``--unroll`` change the lowering (the widest loop TVM vectorises;
``pragma_auto_unroll_max_step`` on each nest's outer loop), to test whether another
lowering beats the default one; ``--sequences`` keeps only the named tiles.

Ratios are against the untuned nest measured in the same process; NumPy is single-threaded.
The default problems: three where no tile leaves a tail, four where splits of ``n`` by
32 or 64 do (112, 176, 240 are 16 mod 32; 80 and 144 leave m/32 tails for no tile here).
"""

from __future__ import annotations

import argparse
import math

from timerl.envs.looptune.ir import ACTIONS, LoopState, Problem, apply_action, initial_state
from timerl.envs.looptune.measure import TVMMeasurer, numpy_gflops


def _tile(mf: int, nf: int) -> list[str]:
    return [f"split_{mf}", "down", "swap_down", "down", f"split_{nf}", "swap_up", "swap_up"]


SEQUENCES = {
    "m2 below k": ["split_2", "down", "swap_down"],
    "m4 below k": ["split_4", "down", "swap_down"],
    **{f"m{a}xn{b}": _tile(a, b) for a in (2, 4, 8) for b in (16, 32, 64)},
    # k blocked by 64 above the m8 x n32 register tile (B's 64 x 32 panel stays in L1)
    "k64 m8xn32": ["split_8", "down", "down", "split_64", "swap_up", "swap_up", "down", "down"]
    + ["swap_down", "down", "split_32", "swap_up", "swap_up"],
}
DEFAULT_PROBLEMS = (
    "mm_64x64x64,mm_128x128x128,mm_256x256x256,mm_208x112x240,mm_240x240x240,mm_80x176x144,mm_96x160x176"
)


def apply(p: Problem, seq: list[str]) -> LoopState:
    s = initial_state(p)
    for a in seq:
        s = apply_action(s, ACTIONS.index(a))
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS)
    ap.add_argument("--max-lanes", type=int, default=64)
    ap.add_argument("--unroll", type=int, default=0)
    ap.add_argument("--sequences", default="", help="comma-separated tile names (default: all)")
    args = ap.parse_args()
    meas = TVMMeasurer(disk_cache=False, max_lanes=args.max_lanes, unroll_max_step=args.unroll)
    chosen = [s for s in args.sequences.split(",") if s] or list(SEQUENCES)
    ratios, best_tail, best_no_tail = [], [], []
    for name in args.problems.split(","):
        p = _problem(name)
        base = meas.gflops(initial_state(p))
        cells = []
        best: tuple[float, str, bool] = (0.0, "", False)
        for label in chosen:
            seq = SEQUENCES[label]
            s = apply(p, seq)
            if len(s.loops) - 5 < sum(a.startswith("split") for a in seq):
                cells.append(f"{label} -")  # a split as large as the loop: not this tile
                continue
            tail = any(lp.tail for lp in s.loops)
            g = meas.gflops(s)
            cells.append(f"{label}{'*' if tail else ''} {g:.0f}")
            best = max(best, (g, label, tail))
        npg = numpy_gflops(p)
        g, label, tail = best
        ratios.append(g / base)
        (best_tail if tail else best_no_tail).append(g / base)
        print(
            f"{name}: untuned {base:.1f}, numpy {npg:.1f}, best {label}{' (tail)' if tail else ''} "
            f"{g:.1f} ({g / base:.2f}x untuned, {g / npg:.2f}x numpy)\n    " + ", ".join(cells),
            flush=True,
        )
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    print(f"geomean best/untuned {geo:.2f}x over {len(ratios)} problems (* = the tile's splits leave a tail)")


def _problem(name: str) -> Problem:
    return Problem.from_name(name)


if __name__ == "__main__":
    main()

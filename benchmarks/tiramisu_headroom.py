"""How much the Tiramisu env's action space can gain on this machine: per benchmark,
hand-written schedules (sequences of the env's own actions on named branches) measured
against the untransformed program with the env's paired measurer.

    python benchmarks/tiramisu_headroom.py [--benchmarks mvt,doitgen] [--sizes default|KEY=...]
        [--repeats 3] [--threads 1] [--serial-only]

``--sizes`` overrides a benchmark's size arguments, e.g. ``mvt:n=2000;doitgen:nr=256,nq=256``.
The best schedules found here are ``benchmarks.HAND_SCHEDULES`` (the evaluation's "hand"
column).
Every candidate is legality-checked by isl (an illegal one is reported, never run); its
speedup is the median over ``--repeats`` fresh measurers (no cache) of the untransformed /
transformed ratio measured in pairs in one process (see ``measure.py``).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from timerl.envs.tiramisu.benchmarks import BENCHMARKS
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.search import apply_sequence
from timerl.errors import TimeRLError


def _tiles(br: int, lvl: int) -> list[str]:
    return [
        f"{br}:T({lvl},{lvl + 1},{x},{y})" for x, y in ((32, 32), (64, 64), (32, 128), (128, 32), (128, 128))
    ]


# time tiling of the two-statement stencils (added actions): skew i by 2t on both
# statements, shift the second by one, tile (t, 2t + i) (the tile covers both statements,
# which share the t loop); optionally fuse the second into the first's (t, i, j) loops.
# All in the env's branch order (branch 0's actions, next, branch 1's).
_TT = "0:S(0,1,2) 1:S(0,1,2) 1:Sh(1)"
_TTU = "0:U(4) 0:S(0,1,2) 1:U(4) 1:S(0,1,2) 1:Sh(1)"
_TIME_TILES = [
    *(f"{_TT} 1:T(0,1,{x},{y})" for x, y in ((32, 32), (32, 64), (32, 128), (64, 32))),
    f"{_TTU} 1:T(0,1,32,32)",
    f"{_TTU} 1:T(0,1,32,64)",
    f"{_TT} 1:F(2)",
    f"{_TTU} 1:F(2)",
    *(f"{_TT} 1:F(2) 1:T(0,1,{x},{y})" for x, y in ((32, 32), (32, 64), (32, 128))),
    f"{_TTU} 1:F(2) 1:T(0,1,32,32)",
    f"{_TTU} 1:F(2) 1:T(0,1,32,64)",
]

# candidate schedules per benchmark: branch:action tokens (branches as in program.branches)
CANDIDATES: dict[str, list[str]] = {
    "mvt": [
        "1:I(0,1)",
        "1:I(0,1) 1:U(4)",
        "1:I(0,1) 1:U(8)",
        "0:U(8) 1:I(0,1) 1:U(8)",
        "1:I(0,1) 1:T(0,1,32,128)",
        "1:I(0,1) 1:T(0,1,128,32)",
        "0:U(4) 1:I(0,1) 1:U(4)",
        *(t for t in _tiles(1, 0)),
        *(f"{t} 1:I(2,3)" for t in _tiles(1, 0)),
        *(f"{t} 1:I(1,2)" for t in _tiles(1, 0)),
        *(f"{t.replace('1:', '0:')} {t}" for t in _tiles(1, 0)),
        "0:P(0) 1:I(0,1) 1:P(1)",
        "0:P(0) 1:P(0)",
        # fusion (added actions): both nests read A[i][j] in one pass
        "1:F(1)",
        "1:I(0,1) 1:F(1)",
        "0:U(4) 1:I(0,1) 1:F(1) 1:U(4)",
        "0:U(8) 1:I(0,1) 1:F(1) 1:U(8)",
        *(f"1:I(0,1) 1:F(1) {t}" for t in _tiles(1, 0)),
        "0:U(4) 1:I(0,1) 1:F(1) 1:U(4) 1:T(0,1,128,32)",
        "0:U(4) 1:I(0,1) 1:F(1) 1:U(4) 1:T(0,1,64,64)",
    ],
    "doitgen": [
        "1:I(2,3)",
        "1:I(2,3) 1:U(4)",
        "1:I(2,3) 1:U(8)",
        "1:I(1,2) 1:I(2,3)",
        "1:T(2,3,32,32)",
        "1:T(2,3,32,128) 1:I(3,4)",
        "1:I(2,3) 1:T(2,3,32,128)",
        "1:I(2,3) 1:U(16)",
        "1:I(2,3) 1:U(32)",
        "1:I(2,3) 1:T(2,3,32,128) 1:U(8)",
        "1:I(2,3) 1:T(0,1,32,32) 1:U(8)",
        "0:P(0) 1:P(0) 2:P(0)",
        "0:P(0) 1:I(2,3) 1:P(0) 2:P(0)",
        "1:F(2) 1:U(8)",  # (added) the init inside the p loop
        "1:F(2) 1:U(16)",
    ],
    "blur": [
        *_tiles(0, 0),
        *(f"{t} {t.replace('0:', '1:')}" for t in _tiles(0, 0)),
        "0:U(4) 1:U(4)",
        "0:U(8) 1:U(8)",
        "0:P(0) 1:P(0)",
        # fusion of the two stages after shifting the second by two rows (added actions)
        "1:Sh(0) 1:Sh(0) 1:F(0)",
        "1:Sh(0) 1:Sh(0) 1:F(1)",
        "0:U(4) 1:Sh(0) 1:Sh(0) 1:F(0) 1:U(4)",
        "0:U(8) 1:Sh(0) 1:Sh(0) 1:F(0) 1:U(8)",
        "0:U(4) 1:Sh(0) 1:Sh(0) 1:F(1) 1:U(4)",
        *(f"1:Sh(0) 1:Sh(0) 1:F(1) {t}" for t in _tiles(1, 0)),
    ],
    "seidel2d": [
        "0:U(4)",
        *_tiles(0, 1),
        "0:S(0,1)",
        "0:S(0,1) 0:S(1,2)",
        "0:S(0,1) 0:S(0,1) 0:S(1,2)",
        "0:S(0,1) 0:T(0,1,32,32)",
        "0:S(0,1) 0:S(1,2) 0:T(1,2,32,32)",
        "0:S(0,1) 0:S(1,2) 0:T(1,2,64,64)",
        "0:S(1,2) 0:S(1,2) 0:I(1,2)",
        "0:S(1,2) 0:S(1,2) 0:I(1,2) 0:U(4)",
        "0:S(1,2) 0:S(1,2) 0:I(1,2) 0:U(8)",
        "0:S(1,2) 0:S(1,2) 0:I(1,2) 0:T(1,2,128,32)",
        "0:S(1,2) 0:S(1,2) 0:I(1,2) 0:T(1,2,32,32)",
        "0:S(1,2) 0:S(1,2) 0:I(1,2) 0:S(0,1) 0:T(0,1,32,32)",
        # the wavefront in one action (added)
        "0:W(1,2,2)",
        "0:W(1,2,2) 0:U(4)",
        "0:W(1,2,2) 0:U(8)",
        "0:W(1,2,2) 0:U(16)",
        *(f"0:W(1,2,2) {t}" for t in _tiles(0, 1)),
        "0:W(1,2,2) 0:S(0,1,2) 0:T(0,1,32,32)",
        "0:W(1,2,2) 0:S(0,1,2) 0:T(0,1,32,128)",
        "0:W(1,2,2) 0:S(0,1) 0:T(0,1,32,128) 0:U(8)",
    ],
    "jacobi2d": [
        *(f"{t} {t.replace('0:', '1:')}" for t in _tiles(0, 1)),
        "0:U(4) 1:U(4)",
        "0:U(8) 1:U(8)",
        "0:U(16) 1:U(16)",
        "0:T(1,2,32,128) 1:T(1,2,32,128) 0:U(4) 1:U(4)",
        "0:T(0,1,32,32) 1:T(0,1,32,32)",
        "0:S(0,1) 1:S(0,1) 0:T(0,1,32,32) 1:T(0,1,32,32)",
        "0:P(1) 1:P(1)",
        *_TIME_TILES,
    ],
    "heat2d": [
        *(f"{t} {t.replace('0:', '1:')}" for t in _tiles(0, 1)),
        "0:U(4) 1:U(4)",
        "0:U(8) 1:U(8)",
        "0:U(16) 1:U(16)",
        "0:T(1,2,128,128) 1:T(1,2,128,128) 0:U(4) 1:U(4)",
        "0:P(1) 1:P(1)",
        *_TIME_TILES,
    ],
    "heat3d": [
        *(f"{t} {t.replace('0:', '1:')}" for t in _tiles(0, 1)),
        *(f"{t} {t.replace('0:', '1:')}" for t in _tiles(0, 2)),
        "0:U(4) 1:U(4)",
        "0:U(8) 1:U(8)",
        "0:U(16) 1:U(16)",
        "0:T(2,3,32,128) 1:T(2,3,32,128) 0:U(4) 1:U(4)",
        "0:P(1) 1:P(1)",
        *_TIME_TILES,
    ],
    "cvtcolor": [
        *_tiles(0, 0),
        "0:U(4)",
        "0:U(16)",
        "0:P(0)",
    ],
}


def _parse_sizes(spec: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for part in filter(None, spec.split(";")):
        name, kv = part.split(":", 1)
        out[name] = {k: int(v) for k, v in (x.split("=") for x in kv.split(","))}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--benchmarks", default=",".join(BENCHMARKS))
    ap.add_argument("--sizes", default="")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--serial-only", action="store_true", help="skip candidates with P(l)")
    ap.add_argument("--top", type=int, default=3, help="re-measure the best N candidates --repeats times")
    args = ap.parse_args()
    sizes = _parse_sizes(args.sizes)
    threads = args.threads or None
    summary = []
    for name in args.benchmarks.split(","):
        prog = BENCHMARKS[name](**sizes.get(name, {}))
        meas = Measurer(disk_cache=False, threads=threads)
        task = TiramisuTask(prog, meas)
        base_ms = 1e3 * meas.base_seconds(prog)
        print(
            f"== {name} {sizes.get(name, '')} branches={prog.branches} untransformed {base_ms:.2f} ms",
            flush=True,
        )
        first: list[tuple[float, str, object]] = []
        for spec in CANDIDATES[name]:
            if args.serial_only and "P(" in spec:
                continue
            try:
                s = apply_sequence(task, spec)
            except TimeRLError as e:
                print(f"  {spec:55s} {str(e).split(': ', 1)[1]}")
                continue
            t = meas.seconds(s)
            sp = meas.base_seconds(prog) / t if math.isfinite(t) else 0.0
            print(f"  {spec:55s} {sp:5.2f}x", flush=True)
            first.append((sp, spec, s))
        first.sort(key=lambda x: -x[0])
        best = (1.0, "(untransformed)")
        for _sp0, spec, s in first[: args.top]:
            vals = []
            for _ in range(args.repeats):
                m = Measurer(disk_cache=False, threads=threads)
                t = m.seconds(s)
                vals.append(m.base_seconds(prog) / t if math.isfinite(t) else 0.0)
            med = float(np.median(vals))
            print(
                f"  re-measured {spec:43s} {med:5.2f}x  ({', '.join(f'{v:.2f}' for v in vals)})", flush=True
            )
            if med > best[0]:
                best = (med, spec)
        summary.append((name, base_ms, best[1], best[0]))
    print(f"\n{time.strftime('%H:%M:%S')} | benchmark | -O3 ms | best hand schedule | speedup |")
    for name, ms, spec, sp in summary:
        print(f"| {name} | {ms:.2f} | `{spec}` | {sp:.2f}x |")
    print(f"| geomean | | | {math.exp(np.mean([math.log(x[3]) for x in summary])):.2f}x |")


if __name__ == "__main__":
    main()

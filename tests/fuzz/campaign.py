"""A differential campaign over fresh seeds, outside pytest (for long runs and reports).

    PYTHONPATH=. python tests/fuzz/campaign.py --start 2000000 --programs 300 --out campaign.jsonl

Each program (``fuzz_programs.generate(seed)``) runs with the default options on both
backends, then with ``--off`` more option sets per program, each flipping one switch from
its default (every switch in turn over the seeds, :data:`FLIPS`) on one backend (each
switch on both backends in turn), and with ``--incrementalize`` incrementalize's option
sets (:data:`INCREMENTALIZE`) on one backend (by the seed's parity). Every run is one JSON
line: seed, backend, options, outcome (``ok``, ``mismatch``: a value differs from the
independent interpreter, ``refused``: a ``TimeRLError``, ``crash``: any other exception,
``hang``: over ``--timeout`` seconds), checks, compile and run seconds (both backends are
imported first, so a library's first import is not a compile). The totals are printed at
the end (and by ``--summary FILE`` for a file written before).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from fuzz_programs import generate, render  # noqa: E402
from test_fuzz import ATOL, RTOL, SWITCHES, W0, IllConditioned, _option_sets, expected  # noqa: E402

from timerl.backends import get_backend  # noqa: E402
from timerl.compile import CompileOptions  # noqa: E402
from timerl.errors import TimeRLError  # noqa: E402

FLIPS: list[dict[str, Any]] = [
    {name: not getattr(CompileOptions(), name), **({"swap_threshold": 1} if name == "swap" else {})}
    for name in SWITCHES
]
"""One switch flipped from its default each (``swap`` on with a threshold that makes it fire)."""
INCREMENTALIZE: list[dict[str, Any]] = [o for o in _option_sets(long=True) if "incrementalize" in o]
"""The long profile's option sets with a tiny incrementalization threshold (alone, and with swapping)."""


class Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def run_one(prog: Any, want: dict, backend: str, opts: dict[str, Any], timeout: int) -> dict[str, Any]:
    rec: dict[str, Any] = {"backend": backend, "options": opts, "checks": 0}
    store: dict[str, dict] = {name: {} for name in want}
    signal.alarm(timeout)
    try:
        ctx, bounds = render(prog, W0, store)
        t0 = time.perf_counter()
        ex = ctx.compile(bounds, backend=backend, **opts)
        rec["compile_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        ex.execute()
        rec["run_s"] = round(time.perf_counter() - t0, 3)
    except Hang:
        rec["outcome"] = "hang"
        return rec
    except TimeRLError as e:
        rec.update(outcome="refused", error=f"{type(e).__name__}: {str(e)[:600]}")
        return rec
    except Exception as e:  # noqa: BLE001 - a crash is what the campaign counts
        rec.update(outcome="crash", error=f"{type(e).__name__}: {str(e)[:600]}")
        return rec
    finally:
        signal.alarm(0)
    bad = []
    for name, points in want.items():
        got = store[name]
        if sorted(got) != sorted(points):
            bad.append(f"{name}: sunk at {sorted(got)}, expected {sorted(points)}")
            continue
        for pt, v in points.items():
            g = np.asarray(got[pt], np.float64)
            if g.shape != np.shape(v) or not np.allclose(g, v, rtol=RTOL, atol=ATOL):
                bad.append(f"{name} at {pt}: got {g.tolist()}, want {np.asarray(v).tolist()}")
            rec["checks"] += 1
    rec["outcome"] = "mismatch" if bad else "ok"
    if bad:
        rec["error"] = "; ".join(bad[:5])
    return rec


def summary(lines: list[dict[str, Any]]) -> str:
    runs = [r for r in lines if "outcome" in r and r["outcome"] != "ill_conditioned"]
    seeds = sorted({r["seed"] for r in lines})
    out = Counter(r["outcome"] for r in runs)
    ill = sum(r.get("outcome") == "ill_conditioned" for r in lines)
    compile_s = [r["compile_s"] for r in runs if "compile_s" in r]
    text = [
        f"programs {len(seeds)} (seeds {seeds[0]}..{seeds[-1]}; {ill} skipped as ill-conditioned), "
        f"runs {len(runs)}, checks {sum(r['checks'] for r in runs)}",
        "outcomes " + ", ".join(f"{k} {v}" for k, v in sorted(out.items())),
    ]
    if compile_s:
        p90, p99 = np.percentile(compile_s, [90, 99])
        text.append(
            f"compile s: median {np.median(compile_s):.2f}, p90 {p90:.2f}, p99 {p99:.2f}, max {max(compile_s):.2f}, "
            f"over 5 s {sum(c > 5 for c in compile_s)}"
        )
        slow = sorted((r for r in runs if "compile_s" in r), key=lambda r: -r["compile_s"])[:5]
        text.append(
            "slowest compiles: "
            + "; ".join(f"{r['seed']} {r['backend']} {r['options']} {r['compile_s']:.2f}s" for r in slow)
        )
    for r in runs:
        if r["outcome"] != "ok":
            text.append(
                f"  seed {r['seed']} {r['backend']} {r['options']}: {r['outcome']}: {r.get('error', '')[:300]}"
            )
    return "\n".join(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--start", type=int, default=2_000_000)
    ap.add_argument("--programs", type=int, default=100)
    ap.add_argument("--off", type=int, default=2, help="option sets with one switch flipped, per program")
    ap.add_argument("--incrementalize", action="store_true", help="incrementalize's option sets too")
    ap.add_argument("--timeout", type=int, default=120, help="seconds a compile and run may take")
    ap.add_argument("--out", type=Path, default=Path("campaign.jsonl"))
    ap.add_argument("--summary", type=Path, default=None, help="only summarise this file")
    args = ap.parse_args()
    if args.summary is not None:
        print(summary([json.loads(x) for x in args.summary.read_text().splitlines() if x.strip()]))
        return
    signal.signal(signal.SIGALRM, _alarm)
    # import both backends before the first timed compile: the first torch import (about
    # 5 s) would otherwise count as the first program's compile time
    t0 = time.perf_counter()
    for name in ("torch", "jax"):
        get_backend(name)
    print(f"backends imported in {time.perf_counter() - t0:.1f}s (not counted as compile time)", flush=True)
    lines: list[dict[str, Any]] = []
    k_off = 0
    with args.out.open("a") as f:
        for seed in range(args.start, args.start + args.programs):
            prog = generate(seed)
            try:
                want = expected(prog)
            except IllConditioned:
                lines.append({"seed": seed, "outcome": "ill_conditioned", "checks": 0})
                f.write(json.dumps(lines[-1]) + "\n")
                continue
            plan: list[tuple[str, dict[str, Any]]] = [("torch", {}), ("jax", {})]
            for _ in range(args.off):
                plan.append((("torch", "jax")[k_off // len(FLIPS) % 2], FLIPS[k_off % len(FLIPS)]))
                k_off += 1
            if args.incrementalize:
                plan += [(("torch", "jax")[seed % 2], opts) for opts in INCREMENTALIZE]
            for backend, opts in plan:
                rec = {"seed": seed, **run_one(prog, want, backend, opts, args.timeout)}
                lines.append(rec)
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if rec["outcome"] != "ok":
                    print(
                        f"seed {seed} {backend} {opts}: {rec['outcome']}: {rec.get('error', '')[:300]}",
                        flush=True,
                    )
    print(summary(lines))


if __name__ == "__main__":
    main()

"""Measure every valid configuration of a RELEASE layer into a measurement table.

With the whole knob space in a table (``TemplateMeasurer(table=...)``, ``python -m timerl.envs.release.study
--table``) a layer becomes a tabular benchmark: tuners run on it measure nothing new, every seed
costs only its search, and the space's true best is known, so a tuner's final can be read as a
fraction of the optimum rather than of another tuner's final. The run is resumable: what the
table holds is not measured again, so it can be stopped and continued.

    python benchmarks/release_exhaustive.py --layer C10 --table runs/rel_table.jsonl
    python benchmarks/release_exhaustive.py --layer C10 --table runs/rel_table.jsonl --summary

The table's key holds the measurer settings (the defaults of ``python -m timerl.envs.release.study``), so the
same file serves ``python -m timerl.envs.release.study --table`` with its default timing flags. The order is a
seeded shuffle, so a stopped run has measured a uniform sample of the space.
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from tqdm import tqdm

from timerl.envs.release.measure import TemplateMeasurer
from timerl.envs.release.space import layer, template_space


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layer", default="C10", help="a RELEASE layer name (C1..C12, MM256, ...)")
    p.add_argument("--table", default="runs/rel_table.jsonl", help="the measurement table (JSON lines)")
    p.add_argument("--limit", type=int, default=0, help="stop after this many new measurements (0: none)")
    p.add_argument("--seed", type=int, default=0, help="the shuffle of the measuring order")
    p.add_argument("--summary", action="store_true", help="measure nothing; summarise what the table holds")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    space = template_space(layer(args.layer))
    measurer = TemplateMeasurer(table=args.table)
    assert measurer.table is not None
    configs = [c for c in np.ndindex(*space.sizes) if space.is_valid(c)]
    order = np.random.default_rng(args.seed).permutation(len(configs))
    todo = [configs[k] for k in order if measurer.table.get(space.layer, configs[k]) is None]
    print(
        f"{args.layer}: {space.size} configurations, {len(configs)} valid, "
        f"{len(configs) - len(todo)} in the table, {len(todo)} to measure",
        flush=True,
    )
    t0 = time.perf_counter()
    if not args.summary:
        for n, cfg in enumerate(tqdm(todo, desc=f"measuring {args.layer}", unit="cfg")):
            if args.limit and n >= args.limit:
                break
            measurer.measure(space, tuple(int(x) for x in cfg))
    held = [measurer.table.get(space.layer, c) for c in configs]
    got = [m for m in held if m is not None]
    valid = sorted((m for m in got if m.valid), key=lambda m: -m.gflops)
    print(
        f"{len(got)} of {len(configs)} valid configurations in the table ({measurer.measured} measured now, "
        f"{time.perf_counter() - t0:.0f} s); {len(got) - len(valid)} failed to build or check",
        flush=True,
    )
    if valid:
        g = np.array([m.gflops for m in valid])
        print(
            f"GFLOPS: best {g[0]:.1f}, 99th pct {np.percentile(g, 99):.1f}, median {np.median(g):.1f}; "
            f"within 95 % of the best: {int(np.sum(g >= 0.95 * g[0]))} configurations",
            flush=True,
        )
        for m in valid[:5]:
            print(f"  {m.gflops:7.1f}  {space.describe(m.config)}", flush=True)


if __name__ == "__main__":
    main()

# RELEASE (Ahn et al., 2019) on one layer: tune the TVM knob space of a ResNet-18 conv2d layer
# with a cost model of gradient-boosted trees, twice at the same measurement budget:
#   - AutoTVM's way: simulated annealing over the cost model, then the greedy sampler measures
#     the top 64 candidates (+ epsilon random) between refits of the model;
#   - RELEASE's way: a PPO agent (a timerl program, timerl.agents.ppo over the knob env, run
#     round by round) searches the cost model, and adaptive sampling measures only the k-means
#     centroids of its candidates, so the model is refit after fewer measurements.
# Every measurement builds the configuration with TVM, checks it against NumPy and times it on
# one core. Prints how many measurements each needed to reach SA + greedy's final best.
# The full four-combination study over many layers and seeds: python -m timerl.envs.release.study
# (docs/release.md). Needs: pip install -e '.[release]'.
from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import timerl as trl
from timerl.envs.release import study
from timerl.envs.release.measure import TemplateMeasurer
from timerl.envs.release.sampling import AdaptiveSampler, GreedySampler
from timerl.envs.release.search import SimulatedAnnealing
from timerl.envs.release.space import layer, template_space
from timerl.envs.release.tuner import tune


@dataclass
class Args(trl.run.RunArgs):
    layer: str = "C9"
    """the layer to tune (timerl.envs.release.space.LAYERS: ResNet-18's C2..C12, MM256)"""
    budget: int = 48
    """hardware measurements per tuner"""
    backend: str = "torch"
    """tensor backend of the PPO search program: torch or jax"""
    table: str = ""
    """a measurement table (JSON lines) shared across runs: each configuration measured once"""
    ray_address: str = ""
    """measure on a Ray measurement farm: the cluster's host:port (what `ray start --head`
    prints), or local for a Ray started on this machine; empty: in this process
    (docs/distributed.md)"""
    farm_workers: int = 0
    """with --ray-address: measurement workers, one pinned core each (0: one per CPU of the
    cluster)"""
    out_dir: str = "runs/release_example"
    """where curves.png goes (best GFLOPS against measurements)"""


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(Args, defaults, "RELEASE on one layer: SA + greedy vs RL + adaptive")


def main(args: Args) -> dict[str, np.ndarray]:
    trl.run.setup_logging()
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    space = template_space(layer(args.layer))
    if args.ray_address:  # each sampled batch measured at once on the farm's workers
        from timerl.dist.farm import farm_from_flags

        farm = farm_from_flags(args.ray_address, args.farm_workers)
        assert farm is not None
        measurer: Any = farm.release_measurer(table=args.table or None)
    else:
        measurer = TemplateMeasurer(table=args.table or None)  # shared: one cache for both tuners
    # the PPO search's hyperparameters are RELEASE's Table 2 (study.Args' defaults)
    ppo_args = replace(study.Args(), backend=args.backend, seed=args.seed, budget=args.budget)
    tuners = {
        "sa+greedy": lambda: (SimulatedAnnealing(), GreedySampler(dedup_ties=True)),
        "rl+adaptive": lambda: (study.RLSearch(ppo_args), AdaptiveSampler(dedup_ties=True)),
    }
    results = {}
    for name, make in tuners.items():
        search, sampler = make()
        t0 = time.perf_counter()
        try:
            results[name] = tune(space, search, sampler, measurer, args.budget, seed=args.seed)
        finally:
            if isinstance(search, study.RLSearch):
                search.close()  # stops the paused PPO program
        r = results[name]
        print(
            f"{args.layer} {name}: best {r.best.gflops:.1f} GFLOPS after {len(r.measurements)} "
            f"measurements ({r.invalid} invalid), {time.perf_counter() - t0:.0f} s",
            flush=True,
        )

    target = 0.99 * results["sa+greedy"].best.gflops  # SA + greedy's final best, within 1 %
    counts = {}
    for name, r in results.items():
        hit = r.to_reach(target)
        counts[name] = hit[0] if hit else None
        print(f"{name}: {counts[name] or 'never'} measurements to SA + greedy's final best")
    if counts["rl+adaptive"]:
        print(f"RL + adaptive needed {counts['sa+greedy'] / counts['rl+adaptive']:.2f}x fewer measurements")

    os.makedirs(args.out_dir, exist_ok=True)
    study.plot_curves(
        {args.layer: {name: [r] for name, r in results.items()}}, Path(args.out_dir) / "curves.png"
    )
    return {name: r.curve for name, r in results.items()}


if __name__ == "__main__":
    main(parse_args())

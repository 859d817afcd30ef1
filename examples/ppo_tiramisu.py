# Tiramisu-style loop optimisation with PPO as a timerl program (papers/tiramisu_rl.txt,
# ch. 2-4): the agent transforms polyhedral loop nests (interchange, reversal, skewing,
# parallelisation, tiling, unrolling, next branch; the paper's 56 actions plus fusion,
# shift, skew by 2, wavefront skew, one-step time tiling and aligned fusion, deep interchanges (84), illegal ones rejected by
# exact isl dependence analysis), every new schedule is compiled with gcc -O3 and timed,
# reward log4(speedup over the previous state). The actor-critic is Table 3.2's: two
# GATv2 attention layers over the padded AST graph (dense masked attention), mean+max
# pooling after each, a summariser, a shared layer, policy and value heads, SELU.
# After training the greedy policy optimises the 8 benchmarks (python -m timerl.envs.tiramisu.evaluate).
# The agent (arguments, network, program, greedy rollouts) is timerl.agents.tiramisu.
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

import timerl as trl
from timerl.agents.tiramisu import GATPolicy, build, greedy_rollouts, latest_weights, make_env
from timerl.agents.tiramisu import TiramisuArgs as Args
from timerl.envs.tiramisu.actions import ACTIONS
from timerl.envs.tiramisu.costmodel import spearman

__all__ = [
    "Args",
    "GATPolicy",
    "build",
    "greedy_rollouts",
    "latest_weights",
    "main",
    "make_env",
    "parse_args",
]


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(
        Args, defaults, "Tiramisu-style loop optimisation: PPO + GATv2, as a timerl program"
    )


def main(args: Args) -> dict:
    trl.run.setup_logging()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoints"
    if args.checkpoint_every <= 0:
        args.checkpoint_every = args.iterations
    args.checkpoint_dir = str(ckpt)
    (out / "args.json").write_text(json.dumps(asdict(args), indent=1))  # for a run stopped early
    returns: dict[int, list[float]] = {}
    means: list[float] = []
    quiet = args.quiet or not args.progress
    run: trl.run.RunLog | None = None  # made once compiled: its bar times iterations only
    t0 = time.perf_counter()
    c0 = os.times()

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        it = pt["i"]
        returns.setdefault(it, []).append(float(v[0]))
        if len(returns[it]) == args.num_envs:
            means.append(float(np.mean(returns[it])))
            meas, sur = env.measurer, env.surrogate
            extra = {"measure_seconds": meas.seconds_spent, "compiles": meas.compiles}
            if sur is not None:
                extra.update(
                    measured=sur.stats.measured, predicted=sur.stats.predicted, cached=sur.stats.cached
                )
            line = (
                f"iter {it:4d} mean return {means[-1]:8.3f} time {time.perf_counter() - t0:6.0f}s "
                + " ".join(f"{k} {v:.0f}" for k, v in extra.items())
            )
            assert run is not None
            run.log(it, line if quiet else None, mean_return=means[-1], episodes=len(env.history), **extra)

    ex, env = build(args, log_fn)
    run = trl.run.RunLog(out, args.iterations, "training", quiet)
    ex.execute()
    run.close(curve="mean_return")
    train_s = time.perf_counter() - t0
    c1 = os.times()
    cpu = {
        "process": (c1.user - c0.user) + (c1.system - c0.system),
        "children": (c1.children_user - c0.children_user) + (c1.children_system - c0.children_system),
    }
    hist = env.history
    best = {}
    for rec in hist:  # measured speedups only (a predicted final time is the model's)
        if not rec.final_predicted:
            best[rec.program] = max(best.get(rec.program, 0.0), rec.speedup)
    meas = env.measurer
    sur = env.surrogate
    summary = {
        "args": asdict(args),
        "train_seconds": train_s,
        "cpu_seconds": cpu,
        "load_average": os.getloadavg(),
        "mean_returns": means,
        "episodes": len(hist),
        "measure_seconds": meas.seconds_spent,
        "compiles": meas.compiles,
        "runs": meas.runs,
        "best_measured_training_speedup": best,
        "surrogate": None
        if sur is None
        else {
            "cached": sur.stats.cached,
            "measured": sur.stats.measured,
            "predicted": sur.stats.predicted,
            "measured_fraction": sur.stats.measured_fraction,
            "refits": sur.stats.refits,
            "fit_seconds": sur.stats.fit_seconds,
            "data_points": len(sur.dataset()[1]),
            "online_checks": len(sur.online),
            "online_spearman": spearman(*zip(*sur.online, strict=True)) if len(sur.online) >= 3 else None,
            "online_mae": float(np.mean([abs(p - m) for p, m in sur.online])) if sur.online else None,
        },
        "predicted_steps": sum(rec.predicted_steps for rec in hist),
        "demo_episodes": sum(rec.demo_steps > 0 for rec in hist),
        "demo_steps": sum(rec.demo_steps for rec in hist),
        "demonstrations": {
            name: {"speedup": sp, "actions": [ACTIONS[a].name for a in acts]}
            for name, (sp, acts) in env.demonstrations.items()
        },
    }
    (out / "train.json").write_text(json.dumps(summary, indent=1))
    print(
        f"trained {args.iterations} iterations in {train_s:.0f}s ({meas.seconds_spent:.0f}s compiling and timing, "
        f"{meas.compiles} compiles; CPU {cpu['process']:.0f}s + {cpu['children']:.0f}s in gcc and the measured "
        f"programs); mean return first/last: {means[0]:.3f} / {means[-1]:.3f}"
        + ("" if sur is None else f"; surrogate: {sur.stats}")
    )
    return summary


if __name__ == "__main__":
    main(parse_args())

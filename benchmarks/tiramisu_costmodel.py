# How well does the Tiramisu env's cost model (timerl.envs.tiramisu.costmodel) rank measured
# schedules it has not seen? Reads the measurer's disk cache (serial CPU-time measurements of
# the 8 benchmarks at their default sizes), fits on the first (1 - holdout) of the records in
# the order they were measured and predicts the rest (the situation during training: new
# schedules from old data), then also on a random split. Prints Spearman's rank correlation
# of predicted and measured log speedups (all held-out schedules, and per benchmark), the mean
# absolute error in log speedup, and how often the ensemble's spread exceeds the surrogate's
# threshold.
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

import timerl as trl
from timerl.envs.tiramisu.benchmarks import benchmark, benchmark_names
from timerl.envs.tiramisu.costmodel import CostModel, spearman
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.surrogate import Surrogate


@dataclass
class Args:
    holdout: float = 0.2
    """fraction of the records held out (the newest ones, then a random sample)"""
    fit_first: int = 0
    """> 0: instead, fit on the first N records and predict the rest (e.g. N = the cache's
    size before a training run: how well the model ranks the schedules that run measured)"""
    threads: int = 1
    """the measurements' thread count (1: the CPU-time cache)"""
    max_std: float = 0.15
    """the surrogate's spread threshold (reported: the share above it)"""
    seed: int = 0
    """seed of the random split and of the model"""


def report(
    name: str, y: np.ndarray, mu: np.ndarray, sd: np.ndarray, progs: np.ndarray, max_std: float
) -> None:
    print(
        f"{name}: {len(y)} held out, Spearman {spearman(mu, y):.3f}, MAE {np.mean(np.abs(mu - y)):.3f} "
        f"(log speedup; spread of the targets {y.std():.3f}), spread > {max_std}: {np.mean(sd > max_std):.0%}"
    )
    for p in sorted(set(progs)):
        m = progs == p
        if m.sum() >= 5:
            print(
                f"  {p:9s} n={m.sum():3d} Spearman {spearman(mu[m], y[m]):6.3f} MAE {np.mean(np.abs(mu[m] - y[m])):.3f}"
            )


def main(args: Args) -> dict:
    programs = [benchmark(n) for n in benchmark_names()]
    sur = Surrogate(Measurer(threads=args.threads), programs, warmup=0)
    x, y, keys = sur.dataset()
    progs = np.asarray([k.split("-", 1)[0] for k in keys])
    n = len(y)
    cut = args.fit_first if args.fit_first > 0 else int(round((1 - args.holdout) * n))
    if not 0 < cut < n:
        raise trl.TimeRLError(f"--fit-first {args.fit_first}: the cache holds {n} usable records")
    out = {}
    splits = {
        f"newest {n - cut} held out": (np.arange(cut), np.arange(cut, n)),
        "random split": tuple(np.split(np.random.default_rng(args.seed).permutation(n), [cut])),
    }
    for name, (tr, te) in splits.items():
        t0 = time.perf_counter()
        cm = CostModel(seed=args.seed).fit(x[tr], y[tr])
        fit_s = time.perf_counter() - t0
        mu, sd = cm.predict(x[te])
        print(f"fit on {len(tr)} in {fit_s:.1f} s")
        report(name, y[te], mu, sd, progs[te], args.max_std)
        out[name] = {"spearman": spearman(mu, y[te]), "mae": float(np.mean(np.abs(mu - y[te]))), "n": len(te)}
    print(f"{n} measured schedules; speedups {math.exp(y.min()):.2f}x .. {math.exp(y.max()):.2f}x")
    return out


if __name__ == "__main__":
    main(trl.run.parse_args(Args, None, "Accuracy of the Tiramisu cost model on cached measurements"))

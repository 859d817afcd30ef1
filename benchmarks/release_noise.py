# Timing noise of the RELEASE measurer: the same configurations timed many times, per timing
# rule (clock x estimator x repeats), interleaved so that every rule sees the same machine load.
# Per layer and rule: the coefficient of variation (std / mean) of one configuration's GFLOPS
# over the repeated measurements (median and max over the configurations), the largest
# max/min ratio, how often two configurations' order flips between two measurements, and the
# seconds one timing takes. Builds once per configuration (the build is not timed).
#
#   OMP_NUM_THREADS=1 TVM_NUM_THREADS=1 python benchmarks/release_noise.py --layers C2,C12 --configs 6 --times 15
from __future__ import annotations

import argparse
import itertools
import json
import os
import time

import numpy as np

os.environ.setdefault("TVM_NUM_THREADS", "1")

from timerl.envs.release import template  # noqa: E402
from timerl.envs.release.measure import TemplateMeasurer  # noqa: E402
from timerl.envs.release.space import layer, template_space  # noqa: E402

RULES = {  # name: (repeats, clock, estimator, timing thread, stack offsets)
    "wall-min-20": (20, "wall", "min", "caller", (0,)),  # TVM's time_evaluator rule
    "wall-median-20": (20, "wall", "median", "caller", (0,)),
    "cpu-min-20": (20, "cpu", "min", "caller", (0,)),  # the CPU-time clock in the calling thread
    "cpu-median-20": (20, "cpu", "median", "caller", (0,)),
    "cpu-min-40": (40, "cpu", "min", "caller", (0,)),
    "cpu-min-20-fresh": (20, "cpu", "min", "fresh", (0, 16, 32, 48)),  # the measurer's default
}


def configs(space, n: int, seed: int) -> list[tuple[int, ...]]:
    """``n`` random valid configurations, half of them vectorised and not parallel (where the
    good ones are), half uniform."""
    rng = np.random.default_rng(seed)
    out: list[tuple[int, ...]] = []
    iv, ip = space.names.index("vectorize"), space.names.index("parallel")
    while len(out) < n:
        c = list(space.random(rng))
        if len(out) % 2 == 0:
            c[iv], c[ip] = 1, 0
        c = tuple(c)
        if space.is_valid(c) and c not in out:
            out.append(c)
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", default="C2,C12")
    p.add_argument("--configs", type=int, default=6)
    p.add_argument("--times", type=int, default=15)
    p.add_argument("--rules", default=",".join(RULES))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="")
    a = p.parse_args()
    rules = a.rules.split(",")
    measurers = {
        r: TemplateMeasurer(
            repeats=RULES[r][0],
            clock=RULES[r][1],
            estimator=RULES[r][2],
            thread=RULES[r][3],
            stack_offsets=RULES[r][4],
        )
        for r in rules
    }
    any_m = next(iter(measurers.values()))
    print(f"load average at start: {os.getloadavg()}", flush=True)
    report = {"load_start": os.getloadavg(), "layers": {}}
    for name in a.layers.split(","):
        space = template_space(layer(name))
        cfgs = configs(space, a.configs, a.seed)
        libs = [template.build(space, c, any_m.target) for c in cfgs]
        g = {r: np.zeros((a.times, len(cfgs))) for r in rules}
        secs = {r: [] for r in rules}
        for t in range(a.times):
            for j, lib in enumerate(libs):
                for r in rules:
                    t0 = time.perf_counter()
                    g[r][t, j] = measurers[r].time_lib(space.layer, lib)
                    secs[r].append(time.perf_counter() - t0)
        rows = {}
        print(f"\n{name}: {len(cfgs)} configurations x {a.times} timings; load average {os.getloadavg()}")
        print(
            f"{'rule':16s} {'CV med':>7s} {'CV max':>7s} {'max/min':>8s} {'flips':>6s} {'s/timing':>9s}  mean GFLOPS"
        )
        for r in rules:
            x = g[r]
            cv = x.std(0) / x.mean(0)
            ratio = (x.max(0) / x.min(0)).max()
            # order flips: pairs of configurations whose order differs between two timings
            flips, pairs = 0, 0
            for i, j in itertools.combinations(range(len(cfgs)), 2):
                s = np.sign(x[:, i] - x[:, j])
                flips += int((s[:, None] != s[None, :]).sum() // 2)
                pairs += a.times * (a.times - 1) // 2
            rows[r] = {
                "cv_median": float(np.median(cv)),
                "cv_max": float(cv.max()),
                "max_over_min": float(ratio),
                "flip_rate": flips / pairs,
                "seconds_per_timing": float(np.median(secs[r])),
                "mean_gflops": [round(float(v), 1) for v in x.mean(0)],
            }
            print(
                f"{r:16s} {rows[r]['cv_median']:7.3f} {rows[r]['cv_max']:7.3f} {ratio:8.2f} "
                f"{rows[r]['flip_rate']:6.3f} {rows[r]['seconds_per_timing']:9.3f}  {rows[r]['mean_gflops']}",
                flush=True,
            )
        report["layers"][name] = {"configs": cfgs, "rules": rows}
    report["load_end"] = os.getloadavg()
    print(f"\nload average at end: {os.getloadavg()}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

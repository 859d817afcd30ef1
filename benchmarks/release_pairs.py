# Paired comparison of timerl.envs.release.study runs: every combination of one layer against a
# baseline combination **of the same process and seed** (same measurer cache, same initial
# configurations), over several results.json files (one per seed, or several seeds each).
# Per combination: the measurements until its best-so-far is within 1 % of the baseline's final
# best of the same seed (a run that never gets there counts its budget and is a miss), the
# baseline's own count to its final over that (ratio of the medians, and per seed), the final
# best over the baseline's, the measurements to 95 % of the best any run of the layer found,
# and the runs that got stuck (final below 90 % of that best). Markdown tables, then the
# per-seed values; last, the mean best-so-far curve of each combination over the seeds and where
# it reaches the baseline's mean final (within 1 %).
#
# --bootstrap N: also a 90 % interval of the "x fewer" ratio (of the per-seed
# medians) from N resamplings of the seeds with replacement, each seed's pair kept together,
# and the geometric mean of the per-seed ratios with its interval from the same resamplings.
#
#   python benchmarks/release_pairs.py --baseline sa+greedy /tmp/relS6/m_C2_s*/results.json
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

STUCK = 0.9


def reach(curve: list[float], target: float) -> tuple[int, bool]:
    hit = np.nonzero(np.asarray(curve) >= target)[0]
    return (int(hit[0]) + 1, True) if len(hit) else (len(curve), False)


def spread(xs: list[float]) -> str:
    return f"{np.median(xs):.1f} ({min(xs):.0f}-{max(xs):.0f})"


def bootstrap_ratio(own: list[int], other: list[int], n: int, seed: int = 0) -> tuple[float, float]:
    """The 5th and 95th percentiles of median(own) / median(other) over ``n`` resamplings of
    the seeds with replacement (``own[i]`` and ``other[i]``: the same seed, kept together)."""
    a, b = np.asarray(own, float), np.asarray(other, float)
    idx = np.random.default_rng(seed).integers(len(a), size=(n, len(a)))
    r = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    return float(np.percentile(r, 5)), float(np.percentile(r, 95))


def bootstrap_geomean(ratios: list[float], n: int, seed: int = 0) -> tuple[float, float, float]:
    """The geometric mean of the per-seed ratios and the 5th and 95th percentiles of it over
    ``n`` resamplings of the seeds with replacement."""
    lr = np.log(np.asarray(ratios, float))
    idx = np.random.default_rng(seed).integers(len(lr), size=(n, len(lr)))
    m = lr[idx].mean(axis=1)
    return float(np.exp(lr.mean())), float(np.exp(np.percentile(m, 5))), float(np.exp(np.percentile(m, 95)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="+")
    p.add_argument("--baseline", default="sa+greedy")
    p.add_argument("--bootstrap", type=int, default=0, help="resamplings for a 90 %% interval of x fewer")
    a = p.parse_args()
    # layer -> combo -> seed -> curve
    runs: dict[str, dict[str, dict[int, list[float]]]] = {}
    for f in a.files:
        res = json.loads(Path(f).read_text())
        seed0 = res["args"]["seed"]
        for layer, combos in res["curves"].items():
            for combo, curves in combos.items():
                for k, c in enumerate(curves):
                    runs.setdefault(layer, {}).setdefault(combo, {})[seed0 + k] = c
    for layer, combos in runs.items():
        base = combos[a.baseline]
        seeds = sorted(base)
        best = max(max(c[-1] for c in cs.values()) for cs in combos.values())
        print(f"\n#### {layer} (best of all runs {best:.1f} GFLOPS; baseline {a.baseline}; seeds {seeds})\n")
        print(
            "| combination | seeds | to 95 %: median (min-max), misses | to baseline final: median (min-max), "
            "misses | x fewer | per-seed x: median (min-max) | final / baseline: median (min-max) | stuck |"
        )
        print("|---|---|---|---|---|---|---|---|")
        per_seed_lines = []
        intervals: list[str] = []
        own = {s: reach(base[s], 0.99 * base[s][-1])[0] for s in seeds}
        for combo, cs in combos.items():
            ss = [s for s in seeds if s in cs]
            to95 = [reach(cs[s], 0.95 * best) for s in ss]
            tob = [reach(cs[s], 0.99 * base[s][-1]) for s in ss]
            ratio = [cs[s][-1] / base[s][-1] for s in ss]
            per = [own[s] / x[0] for s, x in zip(ss, tob, strict=True)]
            x_fewer = np.median([own[s] for s in ss]) / np.median([x[0] for x in tob])
            stuck = sum(cs[s][-1] < STUCK * best for s in ss)
            print(
                f"| {combo} | {len(ss)} | {spread([x[0] for x in to95])}, {sum(not x[1] for x in to95)} | "
                f"{spread([x[0] for x in tob])}, {sum(not x[1] for x in tob)} | **{x_fewer:.2f}x** | "
                f"{np.median(per):.2f} ({min(per):.2f}-{max(per):.2f}) | "
                f"{np.median(ratio):.3f} ({min(ratio):.3f}-{max(ratio):.3f}) | {stuck} of {len(ss)} |"
            )
            if a.bootstrap and combo != a.baseline:
                lo, hi = bootstrap_ratio([own[s] for s in ss], [x[0] for x in tob], a.bootstrap)
                g, glo, ghi = bootstrap_geomean(per, a.bootstrap)
                intervals.append(
                    f"{combo} {x_fewer:.2f}x (90 % interval {lo:.2f}-{hi:.2f}), geometric mean of the "
                    f"per-seed x {g:.2f} ({glo:.2f}-{ghi:.2f})"
                )
            per_seed_lines.append(
                f"{layer:4s} {combo:22s} final {[round(cs[s][-1], 1) for s in ss]}  "
                f"to95 {[x[0] if x[1] else '-' for x in to95]}  "
                f"to {a.baseline} final {[x[0] if x[1] else '-' for x in tob]}"
            )
        if intervals:
            print(f"\nx fewer, seeds resampled {a.bootstrap} times: " + "; ".join(intervals))
        print("\n```")
        print("\n".join(per_seed_lines))
        print("```")
        # the paper's reading of its curves: the mean best-so-far curve over the seeds (the seeds
        # every combination ran), measurements until it reaches the baseline's mean final (1 %)
        common = [s for s in seeds if all(s in cs for cs in combos.values())]
        n = min(len(cs[s]) for cs in combos.values() for s in common)
        mean = {combo: np.mean([cs[s][:n] for s in common], axis=0) for combo, cs in combos.items()}
        target = 0.99 * mean[a.baseline][-1]
        own_mean = reach(list(mean[a.baseline]), target)[0]
        parts = []
        for combo, m in mean.items():
            k, hit = reach(list(m), target)
            parts.append(f"{combo} {k if hit else '-'} ({own_mean / k:.2f}x, final {m[-1]:.1f})")
        print(
            f"\nMean curves over seeds {common}: {a.baseline}'s mean final {mean[a.baseline][-1]:.1f} "
            f"(within 1 %) reached at: " + "; ".join(parts)
        )


if __name__ == "__main__":
    main()

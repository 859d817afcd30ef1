# Pool the results.json files of several timerl.envs.release.study runs (same seeds, same layers):
# per layer, each (file, combination) as a variant, compared seed by seed with the baseline
# SA + greedy runs of one file. Prints, per variant: the median (min-max) measurements to
# reach 95 % of the best any pooled run found on the layer, to reach the baseline's final
# best of the same seed (within 1 %), the ratio of the baseline's medians over these, and
# the final best over the baseline's (median, min). A run that never reaches a target
# counts its whole budget (the ratios built from it are lower bounds) and is counted as
# a miss. Per seed also SA + greedy's count to its own final best over the variant's
# count to it (median, min-max), and the runs that got stuck (final best below 90 % of the
# pooled best).
#
# A comma-separated list of files (same settings, consecutive seeds: --seed 0 --seeds 3, then
# --seed 3 --seeds 3) counts as one run whose seeds are concatenated, baseline included.
#
#   python benchmarks/release_pool.py --baseline A/results.json A/results.json B/results.json
#   python benchmarks/release_pool.py --baseline A/results.json,A2/results.json A/results.json,A2/results.json
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

STUCK = 0.9  # a run whose final best is below this fraction of the pooled best got stuck


def reach(curve: list[float], target: float) -> tuple[int, bool]:
    """(measurements, reached): the first measurement whose best-so-far is >= target."""
    hit = np.nonzero(np.asarray(curve) >= target)[0]
    return (int(hit[0]) + 1, True) if len(hit) else (len(curve), False)


def spread(xs: list[float]) -> str:
    return f"{np.median(xs):.1f} ({min(xs):.0f}-{max(xs):.0f})"


def load(files: str) -> dict:
    """One results.json, or several (comma-separated) with their seeds concatenated."""
    parts = [json.loads(Path(f).read_text()) for f in files.split(",")]
    out = {"args": parts[0]["args"], "curves": {}}
    for part in parts:
        for name, combos in part["curves"].items():
            for combo, curves in combos.items():
                out["curves"].setdefault(name, {}).setdefault(combo, []).extend(curves)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument(
        "files", nargs="+", help="results.json files of timerl.envs.release.study (a,b: seeds concatenated)"
    )
    p.add_argument("--baseline", required=True, help="the file(s) whose sa+greedy runs are the baseline")
    p.add_argument("--baseline-combo", default="sa+greedy")
    args = p.parse_args()
    runs = {f: load(f) for f in args.files}
    base = load(args.baseline)
    for name, base_curves in base["curves"].items():
        ref = base_curves[args.baseline_combo]
        variants: dict[str, list[list[float]]] = {}
        for f, res in runs.items():
            for combo, curves in res["curves"].get(name, {}).items():
                a = res["args"]
                label = f"{'+'.join(Path(x).parent.name for x in f.split(','))}:{combo}"
                if combo.endswith("adaptive"):
                    eps = a.get("adaptive_epsilon", 0.0)
                    label += f" (k {a['k_min']}-{a['k_max']}, knee {a['knee']}, {a['representative']}"
                    label += f", eps {eps})" if eps else ")"
                if combo.startswith("rl"):
                    label += f" (agents {a['num_envs']}, iters {a['iterations']}, pool {a['plan_size']})"
                if a.get("diversity", "none") != "none":
                    label += f" (diversity {a['diversity']})"
                if a.get("cost_objective", "regression") != "regression":
                    label += f" (cost {a['cost_objective']})"
                if combo.startswith("rl") and a.get("episode_len", 10) != 10:
                    label += f" (episode {a['episode_len']})"
                variants[label] = curves
        best = max(max(c[-1] for c in cs) for cs in variants.values())
        print(f"\n{name}: pooled best {best:.1f} GFLOPS; baseline {args.baseline}:{args.baseline_combo}")
        b95 = [reach(c, 0.95 * best)[0] for c in ref]
        bown = [reach(c, 0.99 * c[-1])[0] for c in ref]
        print(
            f"{'variant':<90} {'seeds':>5} {'meas->95% med (min-max)':>24} {'miss':>4} {'x fewer':>7} "
            f"{'meas->SA+G best':>16} {'miss':>4} {'x fewer':>7} {'per-seed x: med (min-max)':>26} "
            f"{'best/SA+G med (min-max)':>24} {'stuck':>5}"
        )
        for label, curves in variants.items():
            n = min(len(curves), len(ref))
            to95 = [reach(c, 0.95 * best) for c in curves[:n]]
            tosg = [reach(c, 0.99 * r[-1]) for c, r in zip(curves[:n], ref[:n], strict=True)]
            ratio = [c[-1] / r[-1] for c, r in zip(curves[:n], ref[:n], strict=True)]
            per_seed = [b / x[0] for b, x in zip(bown[:n], tosg, strict=True)]
            stuck = sum(c[-1] < STUCK * best for c in curves[:n])
            print(
                f"{label:<90} {n:>5} {spread([x[0] for x in to95]):>24} {sum(not x[1] for x in to95):>4} "
                f"{np.median(b95[:n]) / np.median([x[0] for x in to95]):>7.2f} "
                f"{spread([x[0] for x in tosg]):>16} {sum(not x[1] for x in tosg):>4} "
                f"{np.median(bown[:n]) / np.median([x[0] for x in tosg]):>7.2f} "
                f"{np.median(per_seed):>12.2f} ({min(per_seed):.2f}-{max(per_seed):.2f}) "
                f"{np.median(ratio):>10.3f} ({min(ratio):.3f}-{max(ratio):.3f}) {stuck:>5}"
            )


if __name__ == "__main__":
    main()

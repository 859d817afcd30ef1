# The RELEASE study's figures on an exhaustive table (docs/release.md) for any layer whose
# whole space is tabulated. Per
# combination: measurements to SA + greedy's final of the same seed (within 1 %; a miss counts
# 128; the ratio of the per-seed medians with a 90 % bootstrap interval over the seeds, pairs
# kept), the geometric mean of the per-seed ratios, measurements to 95 % of the known optimum
# ("entry"; misses: never), the final over the optimum, finals at the optimum, the share of the
# measurements after the entry within 95 %, the bound (the median count if every measurement
# after the observed entry were a uniformly drawn configuration within 95 %), and, against a
# reference combination (--ref, default rl+adaptive), the seeds on which the count to SA +
# greedy's final is lower / higher and a two-sided sign test.
#
#   python benchmarks/release_analysis/analyse.py --layer C10 runs/release/m_C10_s*.json runs/release/m_C10_*.json runs/release/m_C10_*.json
#   python benchmarks/release_analysis/analyse.py --layer C12 runs/release/m_C12_*.json
from __future__ import annotations

import argparse
import json
import math
import zlib
from pathlib import Path

import numpy as np

# inputs and outputs live under runs/release/ (ignored by git)
RUNS = Path(__file__).resolve().parents[2] / "runs" / "release"


def reach(curve, target: float) -> tuple[int, bool]:
    hit = np.nonzero(np.asarray(curve) >= target)[0]
    return (int(hit[0]) + 1, True) if len(hit) else (len(curve), False)


def top_of(layer: str) -> tuple[float, np.ndarray]:
    """The layer's optimum and the GFLOPS of every configuration within 95 % of it, from
    runs/release/<layer>_top.json (benchmarks/release_analysis/table_top.py on the layer's
    exhaustive measurement table)."""
    d = json.loads((RUNS / f"{layer}_top.json").read_text())
    return float(d["optimum"]), np.sort(np.asarray(d["top_gflops"]))


def load(files: list[str], layer: str) -> tuple[dict, dict]:
    """combination -> seed -> curve, and combination -> seed -> GFLOPS per measurement."""
    curves: dict[str, dict[int, list[float]]] = {}
    gflops: dict[str, dict[int, list[float]]] = {}
    for f in files:
        res = json.loads(Path(f).read_text())
        s0 = res["args"]["seed"]
        for combo, cs in res["curves"].get(layer, {}).items():
            for k, c in enumerate(cs):
                curves.setdefault(combo, {})[s0 + k] = c
        for combo, gs in res.get("gflops", {}).get(layer, {}).items():
            for k, g in enumerate(gs):
                gflops.setdefault(combo, {})[s0 + k] = g
    return curves, gflops


def sign_test(lower: int, higher: int) -> float:
    n = lower + higher
    if n == 0:
        return 1.0
    k = min(lower, higher)
    return min(1.0, 2 * sum(math.comb(n, j) for j in range(k + 1)) / 2**n)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="*")
    p.add_argument("--layer", default="C10")
    p.add_argument("--seeds", default="0-31", help="first-last seed")
    p.add_argument("--ref", default="rl+adaptive")
    p.add_argument("--baseline", default="sa+greedy", help="the combination whose final is the target")
    p.add_argument("--bootstrap", type=int, default=2000)
    a = p.parse_args()
    lo, hi = map(int, a.seeds.split("-"))
    opt, top = top_of(a.layer)
    curves, gflops = load(a.files, a.layer)
    base = curves[a.baseline]
    seeds = [s for s in range(lo, hi + 1) if s in base]
    own = {s: reach(base[s], 0.99 * base[s][-1])[0] for s in seeds}
    ref = curves.get(a.ref, {})
    print(
        f"{a.layer} optimum {opt:.1f} GFLOPS; {len(top)} configurations within 95 %; seeds {lo}-{hi}; "
        f"target: {a.baseline}'s final"
    )
    print(
        "| combination | seeds | to SA + greedy's final: median, misses | x fewer (90 % interval) | "
        "per-seed x: geomean | to 95 % of the optimum: median, misses | final / optimum: median (min) | "
        f"final = optimum | share within 95 % after entry | bound | vs {a.ref}: fewer / more (sign p) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for combo, cs in curves.items():
        ss = [s for s in seeds if s in cs]
        if len(ss) != len(seeds):
            continue
        rng = np.random.default_rng(zlib.crc32(combo.encode()))
        tob = [reach(cs[s], 0.99 * base[s][-1]) for s in ss]
        t95 = [reach(cs[s], 0.95 * opt) for s in ss]
        x = np.array([own[s] for s in ss], float)
        y = np.array([t[0] for t in tob], float)
        idx = rng.integers(len(x), size=(a.bootstrap, len(x)))
        boot = np.median(x[idx], 1) / np.median(y[idx], 1)
        fin = np.array([cs[s][-1] / opt for s in ss])
        row = (
            f"| {combo} | {len(ss)} | {np.median(y):.1f}, {sum(not t[1] for t in tob)} | "
            f"**{np.median(x) / np.median(y):.2f}x** ({np.percentile(boot, 5):.2f}-{np.percentile(boot, 95):.2f}) | "
            f"{np.exp(np.mean(np.log(x / y))):.2f} | {np.median([t[0] for t in t95]):.1f}, "
            f"{sum(not t[1] for t in t95)} | {np.median(fin):.3f} ({fin.min():.3f}) | "
            f"{int((fin >= 0.9999).sum())} |"
        )
        if combo in gflops and all(s in gflops[combo] for s in ss):
            row += " " + where(gflops[combo], base, ss, opt, top, rng)
        else:
            row += " - | - |"
        if combo != a.ref and all(s in ref for s in ss):
            r = np.array([reach(ref[s], 0.99 * base[s][-1])[0] for s in ss])
            fewer, more = int((y < r).sum()), int((y > r).sum())
            row += f" {fewer} / {more} ({sign_test(fewer, more):.2f}) |"
        else:
            row += " - |"
        print(row)


def where(gs: dict, base: dict, seeds: list[int], opt: float, top: np.ndarray, rng) -> str:
    """The share of the measurements after the entry that are within 95 % too, and the bound
    (median over 200 draws of the median count)."""
    shares = []
    for s in seeds:
        g = np.asarray(gs[s])
        e = next((i + 1 for i, v in enumerate(g) if v >= 0.95 * opt), None)
        if e is not None and e < len(g):
            shares.append(float((g[e:] >= 0.95 * opt).mean()))
    meds = []
    for _ in range(200):
        counts = []
        for s in seeds:
            g = np.asarray(gs[s])
            tgt = 0.99 * base[s][-1]
            e = next((i + 1 for i, v in enumerate(g) if v >= 0.95 * opt), None)
            if e is None:
                counts.append(len(g))
            elif g[:e].max() >= tgt:
                counts.append(reach(np.maximum.accumulate(g), tgt)[0])
            else:
                j = reach(rng.permutation(top), tgt)[0]
                counts.append(min(e + j, len(g)))
        meds.append(np.median(counts))
    return f"{np.median(shares):.2f} | {np.median(meds):.1f} |"


if __name__ == "__main__":
    main()

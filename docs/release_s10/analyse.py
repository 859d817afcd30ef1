# Session 10's figures on the exhaustive C10 table (docs/release.md, "Session 10"): per
# combination, measurements to SA + greedy's final of the same seed (within 1 %; the issue's
# strict reading, ratio of the per-seed medians with a 90 % bootstrap interval), measurements
# to 95 % of the known optimum, the final over the optimum; where the measurements go (the
# first measurement within 95 % of the optimum, "entry", and the share of later measurements
# within it); and a bound: the median count if every measurement after the observed entry were
# a uniformly drawn configuration within 95 % of the optimum.
#
#   python docs/release_s10/analyse.py docs/release_s10/m_C10_*.json    # (from the repository root)
from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import numpy as np

DOCS = Path(__file__).resolve().parent.parent
TABLE = DOCS / "release_s9b" / "C10_table.csv"


def reach(curve, target: float) -> tuple[int, bool]:
    hit = np.nonzero(np.asarray(curve) >= target)[0]
    return (int(hit[0]) + 1, True) if len(hit) else (len(curve), False)


def load_table() -> np.ndarray:
    """GFLOPS of every valid configuration of C10."""
    lines = [ln for ln in TABLE.read_text().splitlines() if not ln.startswith("#")]
    out = []
    for ln in lines[1:]:  # (after the header)
        gflops, valid = ln.rsplit(",", 3)[1:3]
        if valid.strip().lower() in ("1", "true"):
            out.append(float(gflops))
    return np.asarray(out)


def load(files: list[str]) -> tuple[dict, dict]:
    """combination -> seed -> curve, and combination -> seed -> GFLOPS per measurement (the
    session-10 files only); session 9b's per-seed files give the baseline and two combinations."""
    curves: dict[str, dict[int, list[float]]] = {}
    gflops: dict[str, dict[int, list[float]]] = {}
    for s in range(32):
        res = json.loads((DOCS / "release_s9b" / f"m_C10_s{s}.json").read_text())
        for combo, cs in res["curves"]["C10"].items():
            curves.setdefault(combo, {})[s] = cs[0]
    for f in files:
        res = json.loads(Path(f).read_text())
        s0 = res["args"]["seed"]
        for combo, cs in res["curves"]["C10"].items():
            for k, c in enumerate(cs):
                curves.setdefault(combo, {})[s0 + k] = c
        for combo, gs in res.get("gflops", {}).get("C10", {}).items():
            for k, g in enumerate(gs):
                gflops.setdefault(combo, {})[s0 + k] = g
    return curves, gflops


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("files", nargs="*")
    p.add_argument("--seeds", default="0-31", help="first-last seed")
    p.add_argument("--bootstrap", type=int, default=2000)
    a = p.parse_args()
    lo, hi = map(int, a.seeds.split("-"))
    table = load_table()
    opt = float(table.max())
    top = np.sort(table[table >= 0.95 * opt])
    curves, gflops = load(a.files)
    base = curves["sa+greedy"]
    seeds = [s for s in range(lo, hi + 1) if s in base]
    own = {s: reach(base[s], 0.99 * base[s][-1])[0] for s in seeds}
    print(f"C10 optimum {opt:.1f} GFLOPS; {len(top)} configurations within 95 %; seeds {lo}-{hi}")
    print(
        "| combination | seeds | to SA + greedy's final: median, misses | x fewer (90 % interval) | "
        "per-seed x: geomean | to 95 % of the optimum: median, misses | final / optimum: median (min) | "
        "final = optimum | share within 95 % after entry | bound |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for combo, cs in curves.items():
        ss = [s for s in seeds if s in cs]
        if len(ss) != len(seeds):
            continue
        rng = np.random.default_rng(
            zlib.crc32(combo.encode())
        )  # (a combination's figures do not depend on the others loaded)
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
        print(row)


def where(gs: dict, base: dict, seeds: list[int], opt: float, top: np.ndarray, rng) -> str:
    """The share of the measurements after the entry (the first within 95 % of the optimum: the
    count "to 95 %") that are within 95 % too, and the bound (median over 200 draws of the
    median count)."""
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

# each run's final over SA + greedy's final of the same seed (median, min) and the
# seeds on which it is below 0.98 of it (the "output code within 2 %"), per combination.
#
#   python benchmarks/release_analysis/final_vs_sag.py C12 runs/release/m_C12_*.json
#   python benchmarks/release_analysis/final_vs_sag.py C12 FILES --baseline=sa+greedy:batch64   (another baseline)
from __future__ import annotations

import sys

import numpy as np
from analyse import load

layer, *files = sys.argv[1:]
baseline = "sa+greedy"
if files and files[-1].startswith("--baseline="):
    baseline, files = files[-1].split("=", 1)[1], files[:-1]
curves, _ = load(files, layer)
base = curves[baseline]
for combo, cs in curves.items():
    ss = sorted(s for s in cs if s in base)
    r = np.array([cs[s][-1] / base[s][-1] for s in ss])
    print(
        f"{combo}: {len(ss)} seeds, final / {baseline}'s: median {np.median(r):.3f}, min {r.min():.3f}, below 0.98 on {int((r < 0.98).sum())}"
    )

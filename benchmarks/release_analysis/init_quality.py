# what the initial design alone gives (the 8 configurations measured before the
# model guides anything): per design, the best of the 8 over the optimum (median over seeds) and
# the seeds on which one of them is within 95 % of the optimum, from the per-seed files.
#
#   python benchmarks/release_analysis/init_quality.py C10 runs/release/m_C10_ucb0.3.json runs/release/m_C10_*.json
from __future__ import annotations

import sys

import numpy as np
from analyse import load, top_of

layer, *files = sys.argv[1:]
opt, _ = top_of(layer)
_, gflops = load(files, layer)
for combo, gs in gflops.items():
    b = np.array([max(g[:8]) / opt for g in gs.values()])
    print(
        f"{combo}: {len(b)} seeds, best of the first 8 / optimum: median {np.median(b):.2f}, within 95 % on {int((b >= 0.95).sum())}"
    )

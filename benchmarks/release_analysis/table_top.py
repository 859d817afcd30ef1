# a layer's optimum and the configurations within 95 % of it, from the exhaustive
# measurement table (runs/rel_table.jsonl, not committed) -> runs/release/<LAYER>_top.json
#
#   python benchmarks/release_analysis/table_top.py C12 /work/main/runs/rel_table.jsonl
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

name, table = sys.argv[1], sys.argv[2]
rows: dict[tuple, tuple[float, bool]] = {}
settings = set()
for ln in open(table):
    r = json.loads(ln)
    if r["layer"].split(":")[0] != name:
        continue
    settings.add(r["settings"])
    rows.setdefault(tuple(r["config"]), (r["gflops"], r["valid"]))
g = np.array([v for v, ok in rows.values() if ok])
opt = float(g.max())
top = sorted(((v, list(c)) for c, (v, ok) in rows.items() if ok and v >= 0.95 * opt), reverse=True)
out = {
    "layer": name,
    "settings": sorted(settings),
    "records": len(rows),
    "valid": int(len(g)),
    "optimum": round(opt, 4),
    "p99": round(float(np.percentile(g, 99)), 2),
    "median": round(float(np.median(g)), 2),
    "within_1pct": int((g >= 0.99 * opt).sum()),
    "top_gflops": [round(v, 4) for v, _ in top],
    "top_configs": [c for _, c in top],
}
dst = Path(__file__).resolve().parents[2] / "runs" / "release" / f"{name}_top.json"
dst.parent.mkdir(parents=True, exist_ok=True)
dst.write_text(json.dumps(out, indent=1))
print(dst, {k: v for k, v in out.items() if k not in ("top_configs", "settings")})

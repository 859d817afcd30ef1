# one study results.json (python -m timerl.envs.release.study) (or several, seeds in order) -> runs/release/m_<LAYER>_<NAME>.json
# (the arguments, each run's best-so-far curve and the GFLOPS of each measurement, per combination).
#
#   python benchmarks/release_analysis/export.py C10 NAME runs/s11/C10_NAME_s0/results.json [--as=COMBO]
from __future__ import annotations

import json
import sys
from pathlib import Path

layer, name, *files = sys.argv[1:]
rename = None
if files and files[-1].startswith("--as="):
    rename, files = files[-1][5:], files[:-1]
out: dict = {"args": None, "curves": {layer: {}}, "gflops": {layer: {}}}
for f in files:
    d = json.loads(Path(f).read_text())
    if out["args"] is None:
        keep = ("seed", "combos", "budget", "plan_size", "diversity", "table")
        out["args"] = {k: d["args"][k] for k in keep}
    for combo, cs in d["curves"][layer].items():
        out["curves"][layer].setdefault(rename or combo, []).extend([[round(x, 4) for x in c] for c in cs])
    for combo, ms in d["measured"][layer].items():
        out["gflops"][layer].setdefault(rename or combo, []).extend([[round(x[1], 2) for x in m] for m in ms])
out["args"]["seeds"] = len(next(iter(out["curves"][layer].values())))
dst = Path(__file__).resolve().parents[2] / "runs" / "release" / f"m_{layer}_{name}.json"
dst.parent.mkdir(parents=True, exist_ok=True)
dst.write_text(json.dumps(out, separators=(",", ":")))
print(dst)

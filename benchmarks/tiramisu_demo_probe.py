"""Why does the greedy policy not follow a program's best training episode? (issue 12,
self-imitation, ``--sil-coef``).

For a trained run, each program's kept demonstration (``train.json``'s ``demonstrations``: the
actions to the fastest measured schedule of any training episode) is replayed step by step
from the untransformed program. At every step it prints the trained network's view of the
state (the legal-masked policy, as in the greedy evaluation, and the value head):

- ``p(demo)`` and ``rank``: the probability and rank of the demonstration's action;
- ``greedy``: the action the greedy policy would take instead, with its probability;
- ``V``: the value estimate; ``R``: the demonstration's discounted return from this step
  (rewards as the env gives them: ``log4`` of the speedup over the previous schedule, the
  penalty ``log4(0.9)`` for ``next``), measured with the disk cache (``--threads 1``, the
  CPU-time clock, as in training); ``R - V``: what self-imitation's term
  ``-log pi(a|s) max(R - V, 0)`` sees (0 when ``V >= R``).

The first step where ``greedy`` differs from the demonstration is where the greedy episode
leaves it.

    python benchmarks/tiramisu_demo_probe.py --run-dir runs/s11_sil_s2 [--programs mvt,doitgen] [--no-return]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
from tiramisu_embeddings import _selu, forward  # the NumPy copy of the network (same directory)

from timerl.agents.tiramisu import latest_weights
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, apply_action
from timerl.envs.tiramisu.benchmarks import benchmark
from timerl.envs.tiramisu.env import PENALTY
from timerl.envs.tiramisu.features import flatten, graph
from timerl.envs.tiramisu.legality import LegalityChecker
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.schedule import initial_schedule


def value(w: dict, z: np.ndarray) -> float:
    """The value head on the shared trunk's output ``z``."""
    y = _selu(z @ w["dnn.v0.w"] + w["dnn.v0.b"])
    y = _selu(y @ w["dnn.v1.w"] + w["dnn.v1.b"])
    return float((y @ w["dnn.v2.w"] + w["dnn.v2.b"]).reshape(()))


def probe(name: str, demo: list[str], w: dict, args: dict, measurer: Measurer | None) -> list[dict]:
    """One row per demonstration step (see the module doc); without a measurer no ``R``."""
    index = {a.name: k for k, a in enumerate(ACTIONS)}
    p = benchmark(name)
    legal = LegalityChecker(p)
    s, br = initial_schedule(p), 0
    t_prev = measurer.seconds(s) if measurer is not None else 1.0
    rows, rewards = [], []
    for a_name in demo:
        a = index[a_name]
        mask = np.asarray(
            [k == NEXT or ((t := apply_action(s, br, k)) is not None and legal(t)) for k in range(NEXT + 1)]
        )
        layers, logits = forward(w, flatten(*graph(s, br)), args["heads"], args["hidden"], args["arch"])
        lg = np.where(mask, logits, -np.inf)
        prob = np.exp(lg - lg.max())
        prob /= prob.sum()
        order = np.argsort(-lg)
        g = int(order[0])
        rows.append(
            {
                "action": a_name,
                "p_demo": float(prob[a]),
                "rank": int(np.nonzero(order == a)[0][0]) + 1,
                "greedy": ACTIONS[g].name,
                "p_greedy": float(prob[g]),
                "V": value(w, layers["z"]),
            }
        )
        if a == NEXT:
            rewards.append(PENALTY)
            br += 1
            continue
        new = apply_action(s, br, a)
        if new is None or not legal(new):
            rewards.append(PENALTY)  # as the env: a no-op with the penalty
            continue
        t_new = measurer.seconds(new) if measurer is not None else t_prev
        rewards.append(math.log(t_prev / t_new, 4))
        s, t_prev = new, t_new
    ret = 0.0
    for row, r in zip(reversed(rows), reversed(rewards), strict=True):
        ret = r + args["gamma"] * ret
        row["R"] = ret if measurer is not None else math.nan
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", required=True, help="a training run (train.json, args.json, checkpoints/)")
    ap.add_argument(
        "--programs", default="", help="comma-separated benchmarks (default: every demonstration)"
    )
    ap.add_argument(
        "--no-return", action="store_true", help="no measurements: the policy only (R and R - V: nan)"
    )
    a = ap.parse_args()
    run = Path(a.run_dir)
    train = json.loads((run / "train.json").read_text())
    args = json.loads((run / "args.json").read_text())
    w = latest_weights(str(run / "checkpoints"))
    args["arch"] = "v2" if "dnn.inp.w" in w else "v1"
    demos = train.get("demonstrations") or {}
    if not demos:
        raise SystemExit(f"{run}/train.json has no demonstrations (a run with --sil-coef > 0 keeps them)")
    names = [n for n in a.programs.split(",") if n] or sorted(demos)
    measurer = None if a.no_return else Measurer(threads=1, clock="cpu")
    for name in names:
        d = demos[name]
        print(f"\n{name}: demonstration {d['speedup']:.2f}x: {' '.join(d['actions'])}")
        print(
            f"  {'step':>4s} {'demo':16s} {'p(demo)':>8s} {'rank':>4s} {'greedy':16s} {'p':>6s} {'V':>7s} {'R':>7s} {'R-V':>7s}"
        )
        for k, row in enumerate(probe(name, d["actions"], w, args, measurer)):
            print(
                f"  {k:4d} {row['action']:16s} {row['p_demo']:8.3f} {row['rank']:4d} {row['greedy']:16s} "
                f"{row['p_greedy']:6.3f} {row['V']:7.3f} {row['R']:7.3f} {row['R'] - row['V']:7.3f}"
            )


if __name__ == "__main__":
    main()

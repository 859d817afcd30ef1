"""Does the agent's network tell the benchmarks apart? Per layer of the GATv2 actor-critic
(``examples/ppo_tiramisu.py``), the embeddings of states of the 8 benchmarks (the
untransformed program and a few random legal schedules of each, all branches focused in
turn) compared across programs and within one program, and the policy's action
distributions per program.

    python benchmarks/tiramisu_embeddings.py [--weights RUN_DIR/checkpoints] [--arch v1|v2]
        [--states 6] [--seed 0]

Without ``--weights`` the network's initial weights (``--seed``) are used. Printed per
layer (input mean-pool, GAT layer 1 and 2 mean+max pools, the shared trunk ``z``):

- ``between / within``: mean distance between the programs' mean embeddings over the mean
  distance of a program's states to their own mean (>> 1: the layer separates programs);
- ``1-NN``: leave-one-out nearest-neighbour accuracy of the program label (1.0: separable);
- ``cos``: the mean cosine similarity of two programs' initial-state embeddings (~1.0:
  the layer sees the same thing in every program).

And per program the greedy action at its initial state (legal actions only, as in the
evaluation), and the mean total-variation distance between two programs' masked action
distributions at their initial states (the masks alone make it > 0, so compare it between
weights), and the same without the masks (0: a program-blind policy).
The forward pass is a NumPy copy of the RT network (``tests/examples/test_ppo_tiramisu.py``
checks the RT network against an independent NumPy reference).
"""

from __future__ import annotations

import argparse

import numpy as np

from timerl.agents.tiramisu import GATPolicy, latest_weights
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, apply_action
from timerl.envs.tiramisu.benchmarks import BENCHMARKS, benchmark
from timerl.envs.tiramisu.features import MAX_NODES, flatten, graph, unflatten
from timerl.envs.tiramisu.legality import LegalityChecker
from timerl.envs.tiramisu.schedule import initial_schedule


def _selu(x: np.ndarray) -> np.ndarray:
    return 1.0507009873554805 * np.where(x > 0, x, 1.6732632423543772 * (np.exp(np.minimum(x, 0)) - 1))


def forward(w: dict, obs: np.ndarray, heads: int, hidden: int, arch: str) -> tuple[dict, np.ndarray]:
    """The network's layers (name -> embedding) and the policy logits for one observation."""
    x, adj, m = unflatten(obs)
    real = m > 0
    layers = {"input": x[real].mean(0)}
    pooled = []
    h = x
    if arch == "v2":
        pooled.append(np.concatenate([x[real].mean(0), x[real].max(0)]) @ w["dnn.inp.w"] + w["dnn.inp.b"])
    for k in (1, 2):
        xl = (h @ w[f"dnn.gat{k}.wl"]).reshape(MAX_NODES, heads, hidden)
        xr = (h @ w[f"dnn.gat{k}.wr"]).reshape(MAX_NODES, heads, hidden)
        s = xr[:, None] + xl[None, :]
        s = np.where(s > 0, s, 0.2 * s)
        e = (s * w[f"dnn.gat{k}.att"]).sum(-1)
        e = np.where(adj[:, :, None] > 0, e, -1e9)
        e = e - e.max(1, keepdims=True)
        alpha = np.exp(e) / np.exp(e).sum(1, keepdims=True)
        out = np.einsum("ijh,jhc->ihc", alpha, xl).reshape(MAX_NODES, -1) + w[f"dnn.gat{k}.bias"]
        h = _selu(out @ w[f"dnn.lin{k}.w"] + w[f"dnn.lin{k}.b"])
        pooled.append(np.concatenate([h[real].mean(0), h[real].max(0)]))
        layers[f"gat{k}"] = pooled[-1]
    z = _selu(np.concatenate(pooled) @ w["dnn.summ.w"] + w["dnn.summ.b"])
    z = _selu(z @ w["dnn.shared.w"] + w["dnn.shared.b"])
    layers["z"] = z
    y = z
    for j in range(3):
        y = y @ w[f"dnn.pi{j}.w"] + w[f"dnn.pi{j}.b"]
        if j < 2:
            y = _selu(y)
    return layers, y


def states(name: str, n: int, rng: np.random.Generator) -> tuple[list[np.ndarray], np.ndarray]:
    """The untransformed program and ``n - 1`` random legal schedules (a random walk of
    legal actions), each with a random focused branch; the first is the initial state.
    Also the legal-action mask of the initial state (as the evaluation's ``--eval-mask legal``)."""
    p = benchmark(name)
    legal = LegalityChecker(p)
    s = initial_schedule(p)
    mask = np.asarray(
        [a == NEXT or ((t := apply_action(s, 0, a)) is not None and legal(t)) for a in range(NEXT + 1)]
    )
    out = [flatten(*graph(s, 0))]
    nb = len(p.branches)
    while len(out) < n:
        br = int(rng.integers(nb))
        cands = [a for a in range(NEXT) if (t := apply_action(s, br, a)) is not None and legal(t)]
        if not cands:
            break
        s = apply_action(s, br, int(rng.choice(cands)))
        out.append(flatten(*graph(s, br)))
    return out, mask


def report(w: dict, heads: int, hidden: int, arch: str, n_states: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    names = list(BENCHMARKS)
    emb: dict[str, list[np.ndarray]] = {}
    labels: list[int] = []
    logits0, raw0 = {}, {}
    for k, name in enumerate(names):
        obs_list, mask = states(name, n_states, rng)
        for j, obs in enumerate(obs_list):
            layers, logits = forward(w, obs, heads, hidden, arch)
            for ln, v in layers.items():
                emb.setdefault(ln, []).append(v)
            labels.append(k)
            if j == 0:
                logits0[name] = np.where(mask, logits, -np.inf)
                raw0[name] = logits
    lab = np.asarray(labels)
    out: dict[str, float] = {}
    print(f"{'layer':8s} {'between/within':>15s} {'1-NN':>6s} {'cos(initial)':>13s}")
    first = np.asarray([labels.index(k) for k in range(len(names))])
    for ln, vs in emb.items():
        e = np.stack(vs)
        means = np.stack([e[lab == k].mean(0) for k in range(len(names))])
        between = np.mean([np.linalg.norm(means[a] - means[b]) for a in range(len(names)) for b in range(a)])
        within = np.mean([np.linalg.norm(e[i] - means[lab[i]]) for i in range(len(e))])
        d = np.linalg.norm(e[:, None] - e[None, :], axis=-1)
        np.fill_diagonal(d, np.inf)
        nn = float(np.mean(lab[d.argmin(1)] == lab))
        e0 = e[first]
        unit = e0 / (np.linalg.norm(e0, axis=1, keepdims=True) + 1e-12)
        c = unit @ unit.T
        cos = float(c[np.triu_indices(len(names), 1)].mean())
        ratio = float(between / max(within, 1e-12))
        print(f"{ln:8s} {ratio:15.2f} {nn:6.2f} {cos:13.3f}")
        out[f"{ln}.ratio"], out[f"{ln}.nn"], out[f"{ln}.cos"] = ratio, nn, cos
    probs = {}
    for name, lg in logits0.items():
        p = np.exp(lg - lg.max())
        probs[name] = p / p.sum()
        top = np.argsort(-lg)[:3]
        print(
            f"  {name:9s} greedy {ACTIONS[top[0]].name:16s} top-3 " + ", ".join(ACTIONS[a].name for a in top)
        )
    tv = np.mean([0.5 * np.abs(probs[a] - probs[b]).sum() for a in names for b in names if a < b])
    raw = {n: np.exp(v - v.max()) / np.exp(v - v.max()).sum() for n, v in raw0.items()}
    tv_raw = np.mean([0.5 * np.abs(raw[a] - raw[b]).sum() for a in names for b in names if a < b])
    print(f"mean total-variation distance between the programs' unmasked action distributions: {tv_raw:.3f}")
    out["tv_unmasked"] = float(tv_raw)
    print(
        f"mean total-variation distance between the programs' (legal-masked) action distributions: {tv:.3f}"
    )
    out["tv"] = float(tv)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default="", help="a run's checkpoint dir (default: initial weights)")
    ap.add_argument(
        "--arch", default="", help="v1 (Table 3.2) or v2 (with the input skip); default: the weights'"
    )
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--states", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.weights:
        w = latest_weights(args.weights)
        arch = args.arch or ("v2" if "dnn.inp.w" in w else "v1")
    else:
        arch = args.arch or "v2"
        w = GATPolicy.init_weights(args.seed, args.heads, args.hidden, arch)
    print(f"arch {arch}, weights {args.weights or f'initial (seed {args.seed})'}")
    report(w, args.heads, args.hidden, arch, args.states, args.seed)


if __name__ == "__main__":
    main()

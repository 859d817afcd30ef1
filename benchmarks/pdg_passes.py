"""What each PDG pass contributes on PPO: the passes switched on one after the other, in the
order ``timerl.compile`` runs them, and for each row the PDG's size and the work per iteration.

``examples/ppo.py``'s fixed-length program (``build_fixed``, one epoch, one minibatch) on
gymnasium's CartPole; batch vectorization (``vectorize``) and dead-code elimination run in
every row, every other option at its default. Columns: PDG nodes, nodes whose domain has the
step dim ``t``, statements (nodes after clustering, ``schedule.cluster.cluster_pdg``), and per
iteration the executed node points and the dispatches (``Executor.dispatches``: one per
region, node or scanned loop entry), averaged over ``--iterations``::

    python benchmarks/pdg_passes.py --num-envs 64 --num-steps 32 --backend torch
"""

from __future__ import annotations

import argparse

from timerl.agents.ppo import PPOArgs, build_fixed
from timerl.compile import Executor
from timerl.schedule.cluster import cluster_pdg

# the passes in the order timerl.compile runs them (vectorize_time last)
PASSES = ("simplify", "broadcast", "cse", "contract", "scan_lift", "vectorize_time")


def measure(args: PPOArgs, on: set[str]) -> dict[str, int]:
    """The table's columns for PPO compiled with the passes in ``on`` (and no other of
    ``PASSES``)."""
    ex: Executor = build_fixed(args, lambda *_: None, **{p: p in on for p in PASSES})
    ex.execute()
    n = args.iterations
    return {
        "nodes": len(ex.pdg.nodes),
        "over t": sum(any(s.name == "t" for s in node.domain) for node in ex.pdg.nodes.values()),
        "statements": len(cluster_pdg(ex.pdg)[1]),
        "points / iter": round(ex._interp.exec_count / n),
        "dispatches / iter": round(ex.dispatches / n),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-envs", type=int, default=64)
    ap.add_argument("--num-steps", type=int, default=32)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--backend", default="torch", choices=["jax", "torch"])
    a = ap.parse_args()
    args = PPOArgs(
        num_envs=a.num_envs,
        num_steps=a.num_steps,
        iterations=a.iterations,
        backend=a.backend,
        update_epochs=1,
        num_minibatches=1,
        checkpoint_every=0,
    )
    print(
        "| after | PDG nodes | nodes over t | statements | executed node points / iteration "
        "| dispatches / iteration |"
    )
    print("|---|---|---|---|---|---|")
    for k in range(len(PASSES) + 1):
        row = measure(args, set(PASSES[:k]))
        name = f"+ {PASSES[k - 1]}" if k else "lowering (+ vectorize b, dce)"
        print(f"| {name} | " + " | ".join(f"{v:,}" for v in row.values()) + " |", flush=True)


if __name__ == "__main__":
    main()

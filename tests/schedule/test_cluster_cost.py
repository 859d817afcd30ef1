"""Statement clustering stays cheap on PPO with update epochs and minibatches (issues 10, 15).

Work counts, not wall-clock time: the path states :mod:`timerl.schedule.cluster` takes off
its work stack and the edge steps it computes, on the PPO program over (b, i, e, m, t)
with E = M = 2. Before the merge checks shared their per-cluster steps and stopped
following paths that can no longer return too early, the fixed-length program took 1.4M
states and 2.4M edge steps (about 30 s), the one with episodes 0.86M and 1.8M; now 48k
and 22k, and 100k and 20k (the bounds below leave a margin of 3x).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from timerl.pdg.ir import PDG
from timerl.schedule.cluster import _merge_all, split_prologue
from timerl.schedule.scheduler import bound_order_edges

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from example_pdg import lower_example, ppo  # noqa: E402


def _ppo(fixed: bool) -> PDG:
    args = ppo.Args(num_envs=2, iterations=2, hidden=8, update_epochs=2, num_minibatches=2)
    if fixed:
        args.num_steps = 8
    pdg = lower_example(ppo.build_fixed if fixed else ppo.build, args, lambda v, p: None)
    rest, _ = split_prologue(pdg.with_(edges=pdg.edges + bound_order_edges(pdg)))
    return rest


@pytest.mark.parametrize("fixed", [True, False], ids=["fixed-steps", "episodes"])
def test_ppo_epochs_minibatches_cluster_cheaply(fixed: bool) -> None:
    pdg = _ppo(fixed)
    c = _merge_all(pdg)
    assert len(c.members) <= 20  # the (i, e, m) update still fuses into few statements
    assert c.visits < VISITS[fixed], c.visits
    assert c.walks < WALKS[fixed], c.walks


VISITS = {True: 150_000, False: 300_000}
WALKS = {True: 70_000, False: 60_000}

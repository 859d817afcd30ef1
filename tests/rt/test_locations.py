"""Where a node was defined (``BNode.where``, in labels, plans and errors): the first frame
outside timerl's API, so the user's line, or the line of a program shipped in the package
(``timerl/agents``) rather than the line that called it."""

from __future__ import annotations

import numpy as np

import timerl as trl
from timerl.agents.ppo import PPOArgs, build_fixed


def test_a_users_nodes_are_located_at_their_lines() -> None:
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, _I),):
        w = trl.param(np.ones(2, np.float32), domain=(i,), name="w")
        y = (w * 2.0).tanh()  # the line
        w[i + 1] = w - 0.1 * y
    wheres = {n.where for n in ctx.graph.nodes.values()}
    assert any(w.startswith("test_locations.py:") and "# the line" in w for w in wheres), wheres
    assert not any("timerl/" in w or w == "?" for w in wheres), wheres


def test_a_program_shipped_in_the_package_is_located_at_its_own_lines() -> None:
    """PPO's nodes are at lines of timerl/agents/ppo.py (before, every node of it was at the
    caller's line, the same for all), its network's at the lines that build it there."""
    args = PPOArgs(env_id="CartPole-v1", num_envs=2, num_steps=4, iterations=1, backend="torch")
    ex = build_fixed(args, lambda *a: None)
    labels = [n.label for n in ex.pdg]
    inside = [lb for lb in labels if "defined at timerl/agents/ppo.py:" in lb]
    assert len(inside) > len(labels) // 2, labels[:20]
    assert len({lb.split(" (`")[0] for lb in inside}) > 10  # many distinct lines, not one
    assert not any("test_locations.py" in lb for lb in labels)

"""``examples/ppo.py``: activations reused by learning (TimeRL Fig. 4), short training runs."""

from __future__ import annotations

import math

import pytest
from example_pdg import lower_example, ppo

from timerl.pdg.ops import OpKind
from timerl.schedule.ast import Exec, Loop, walk
from timerl.schedule.scheduler import schedule_pdg


def _pdg(args: ppo.Args):
    return lower_example(ppo.build, args, lambda v, p: None)


def test_one_epoch_reuses_the_acting_forward_pass() -> None:
    """Policy and critic: 3 layers each, so 6 forward matmuls per (i, t) point and no more;
    backward: a weight gradient per layer and an input gradient per layer but the first."""
    pdg = _pdg(ppo.Args(iterations=2, num_envs=2))
    mms = [n for n in pdg if n.op.kind is OpKind.MATMUL]

    def param_read(n):
        names = [pdg.nodes[e.src].name or "" for e in pdg.data_in_edges(n.id)]
        return next((x for x in names if x.startswith("dnn.")), None)

    per_layer = sorted(p for p in map(param_read, mms) if p is not None)
    assert per_layer == ["dnn.vw0", "dnn.vw1", "dnn.vw2", "dnn.w0", "dnn.w1", "dnn.w2"]
    assert len(mms) == 6 + 2 * (3 + 2)
    assert all(n.domain == pdg.nodes[mms[0].id].domain for n in mms)  # all per (i, t) point


def test_gae_runs_backwards_after_acting() -> None:
    pdg = _pdg(ppo.Args(iterations=2, num_envs=2))
    sched = schedule_pdg(pdg)
    adv = next(n.id for n in pdg if n.name == "adv")
    step = next(n.id for n in pdg if n.op.kind is OpKind.UDF and len(n.domain) == 2)

    def loop_of(nid):
        return [
            x
            for x in walk(sched.ast)
            if isinstance(x, Loop) and any(isinstance(y, Exec) and y.node == nid for y in walk(x.body))
        ][-1]

    act, gae = loop_of(step), loop_of(adv)
    assert act is not gae
    assert gae.inc == 1 and "T" in str(gae.init)  # runs from t = T - 1 down (counter -t)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_short_training_run(backend: str, capsys) -> None:
    means = ppo.main(ppo.Args(backend=backend, iterations=2, num_envs=3, seed=1))
    assert len(means) == 2 and all(math.isfinite(m) and 8 <= m <= 500 for m in means)
    assert "env steps" in capsys.readouterr().out

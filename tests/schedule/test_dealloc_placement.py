"""Placement of deallocation statements (``timerl.schedule.dealloc``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from timerl.schedule.ast import Dealloc, Exec, Loop, Seq, walk
from timerl.schedule.dealloc import sink_frees
from timerl.schedule.scheduler import schedule_pdg
from timerl.symbolic import Sym

sys.path.insert(0, str(Path(__file__).parents[1] / "examples"))


def _reinforce(n: int):
    from example_pdg import lower_example, reinforce

    return lower_example(reinforce.build, reinforce.Args(n=n, iterations=3, num_envs=2), lambda v, p: None)


def _strip(node):
    """The AST without its frees."""
    if isinstance(node, Seq):
        return Seq(tuple(_strip(c) for c in node.children if not isinstance(c, Dealloc)))
    if isinstance(node, Loop):
        return Loop(node.var, node.init, node.cond, node.inc, _strip(node.body))
    return node


@pytest.mark.parametrize("n", [0, 8])
def test_frees_keep_the_compute_schedule_and_free_every_read_node(n: int) -> None:
    """The frees are grafted into the frozen schedule: the execs run in the same order; every
    node some data edge reads (outside the prologue) gets a free."""
    pdg = _reinforce(n)
    plain, freed = schedule_pdg(pdg), schedule_pdg(pdg, dealloc=True)
    execs = lambda s: [(x.node, x.point) for x in walk(s.ast) if isinstance(x, Exec)]  # noqa: E731
    assert execs(plain) == execs(freed)
    assert not any(isinstance(x, Dealloc) for x in walk(plain.ast))
    freed_nodes = {x.node for x in walk(freed.ast) if isinstance(x, Dealloc)}
    read = {e.src for e in pdg.edges if not e.order_only and pdg.nodes[e.src].domain}
    assert freed_nodes == read


def test_nstep_frees_observations_inside_the_acting_loop() -> None:
    """n = 8: learning runs 7 steps behind acting; the observation is freed at its own step
    (its readers run there) and what learning reads 7 steps later, in the same loop
    iteration as learning (O(n) steps live, not O(T))."""
    pdg = _reinforce(8)
    ast = schedule_pdg(pdg, dealloc=True).ast
    obs = next(x.id for x in pdg if x.name == "obs")
    loops = [x for x in walk(ast) if isinstance(x, Loop)]
    acting = [lp for lp in loops if any(isinstance(s, Exec) and s.node == obs for s in walk(lp.body))]
    inner = acting[-1]
    frees = [s for s in walk(inner.body) if isinstance(s, Dealloc)]
    assert any(s.node == obs and s.point[-1] is inner.var for s in frees)
    late = {s.node for s in frees if s.point[-1] == inner.var - 7}
    learn = {s.node for s in walk(inner.body) if isinstance(s, Exec) and s.point[-1] == inner.var - 7}
    assert len(late) >= 5 and learn


def test_sink_frees_moves_frees_past_execs_only() -> None:
    c = Sym("_c0")
    a, b, f = Exec(1, (c,)), Exec(2, (c,)), Dealloc(1, (c,))
    lp = Loop(Sym("_c1"), c, c < 3, 1, Seq((a,)))
    got = sink_frees(Seq((a, f, b, Seq((a, b)), lp, f, a)))
    assert got == Seq((a, b, Seq((a, b)), f, lp, a, f))
    assert _strip(got) == Seq((a, b, Seq((a, b)), lp, a))

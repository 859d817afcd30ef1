"""Statements over a dynamically bounded dim run inside or after the loop that finds the bound.

isl sees a dynamic bound ``T`` as one parameter; the runtime finds it per enclosing
point (per ``i``) while it runs ``T``'s SET_SYMBOL node. A node over ``(i, t)`` that
reads nothing along ``t`` used to get a ``t`` loop of its own before the acting loop
(BoundError at run time); a node over ``t`` alone had no single ``T`` at all.
"""

from __future__ import annotations

import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ops import OpKind
from timerl.pdg.passes.enclose import enclose_dynamic_dims
from timerl.rt.lower import lower
from timerl.runtime.reference import reference_evaluate
from timerl.schedule.ast import Exec, Loop, walk
from timerl.schedule.scheduler import BOUND_ORDER_IID, bound_order_edges, schedule_pdg

BACKENDS = ["jax", "torch"]


def _program(parity_domain: bool):
    """Episode ``i`` ends at ``t = i + 2`` (T = i + 3); ``s[i]`` sums ``t % 2`` over it."""
    out: list[tuple[int, float]] = []
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        c = trl.empty((), domain=(i,), name="c")
        c[0] = trl.const(0.0)
        c[i + 1] = c + 1.0
        d = trl.as_tensor(t) >= c + 2  # as_tensor(t) is over t alone
        if parity_domain:
            parity = trl.as_tensor(t % 2, domain=(i,))  # reads nothing over t
        else:
            parity = trl.as_tensor(t % 2) * 1.0
        s = parity[i, 0:T].sum(0) if parity_domain else (parity + c * 0.0)[i, 0:T].sum(0)
        s.sink(lambda v, p: out.append((p["i"], float(v))), name="s")
    return ctx, {I: 3, T: d}, out


WANT = [(0, 1.0), (1, 2.0), (2, 2.0)]  # t % 2 summed over t < 3, 4, 5


@pytest.mark.parametrize("parity_domain", [True, False])
@pytest.mark.parametrize("backend", BACKENDS)
def test_values_match_hand_computed_and_reference(backend: str, parity_domain: bool) -> None:
    ctx, bounds, out = _program(parity_domain)
    ctx.compile(bounds, backend=backend).execute()
    assert sorted(out) == WANT
    out.clear()
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    assert sorted(out) == WANT


def test_setter_loop_comes_first() -> None:
    """Every statement over (i, t) runs in the SET_SYMBOL node's t loop or after it."""
    ctx, bounds, _ = _program(True)
    pdg = build_pdg(ctx, bounds, CompileOptions())
    ast = schedule_pdg(pdg).ast
    setter = next(n.id for n in pdg if n.op.kind is OpKind.SET_SYMBOL)
    t_loop = next(
        x
        for x in walk(ast)
        if isinstance(x, Loop)
        and any(isinstance(y, Exec) and y.node == setter for y in walk(x.body))
        and not any(isinstance(y, Loop) for y in walk(x.body))
    )
    inside = {y.node for y in walk(t_loop.body) if isinstance(y, Exec)}
    over_t = {n.id for n in pdg if len(n.domain) == 2}
    assert over_t <= inside  # here isl fuses them all into the acting loop
    order = [y.node for y in walk(ast) if isinstance(y, Exec)]
    summed = next(n.id for n in pdg if n.op.kind is OpKind.SUM)
    assert order.index(summed) > order.index(setter)


def test_enclose_widens_pure_nodes_over_t_alone() -> None:
    ctx, bounds, _ = _program(True)
    low = lower(ctx, bounds)
    ev = [n for n in low if n.op.kind is OpKind.EVAL_SYMBOL and len(n.domain) == 1]
    assert [str(d) for d in ev[0].domain] == ["t"]
    wide = enclose_dynamic_dims(low)
    assert [str(d) for d in wide.nodes[ev[0].id].domain] == ["i", "t"]
    for e in wide.out_edges(ev[0].id):
        assert [str(c) for c in e.phi] == ["i", "t"]


def test_bound_order_edges() -> None:
    ctx, bounds, _ = _program(True)
    pdg = build_pdg(ctx, bounds, CompileOptions())
    edges = bound_order_edges(pdg)
    setter = next(n.id for n in pdg if n.op.kind is OpKind.SET_SYMBOL)
    assert edges and all(e.src == setter and e.order_only and e.iid == BOUND_ORDER_IID for e in edges)
    # as_tensor(t) and the parity read nothing over (i, t); `d` reads as_tensor(t) at (i, t)
    ev = {n.id for n in pdg if n.op.kind is OpKind.EVAL_SYMBOL and len(n.domain) == 2}
    assert {e.sink for e in edges if str(e.phi[1]) == "t - 1"} == ev
    summed = next(n.id for n in pdg if n.op.kind is OpKind.SUM)
    assert [str(e.phi[1]) for e in edges if e.sink == summed] == ["T - 1"]


def test_no_edges_without_dynamic_bounds() -> None:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        trl.as_tensor(t % 2, domain=(i,)).sink(lambda v, p: None)
    assert bound_order_edges(build_pdg(ctx, {I: 2, T: 3}, CompileOptions())) == ()

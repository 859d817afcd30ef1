"""Polyhedral scheduling of hand-built PDGs: REINFORCE shapes, conditions, errors."""

from __future__ import annotations

import dataclasses

import pytest
from schedule_pdgs import SCALAR, Builder, I, T, i, ppo_like, reinforce, t

from timerl.errors import BoundError, NonAffineIndexError, ScheduleError
from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import Op, OpKind
from timerl.schedule.ast import AstNode, Exec, If, Loop, Seq, walk
from timerl.schedule.check import run_ast, verify_ast
from timerl.schedule.scheduler import Schedule, schedule_pdg
from timerl.symbolic import Slice, Sym


def loops_with(ast: AstNode, nid: int) -> list[Loop]:
    """Loops (outermost first) that contain an Exec of node ``nid``."""
    return [
        n
        for n in walk(ast)
        if isinstance(n, Loop) and any(isinstance(x, Exec) and x.node == nid for x in walk(n.body))
    ]


def innermost_loop(ast: AstNode, nid: int) -> Loop:
    ls = loops_with(ast, nid)
    assert ls, f"node {nid} is not inside a loop"
    return ls[-1]


def preorder_index(ast: AstNode, target: AstNode) -> int:
    for k, n in enumerate(walk(ast)):
        if n is target:
            return k
    raise AssertionError("not found")


# -- REINFORCE ---------------------------------------------------------------------------


def test_mc_reinforce_acts_then_learns() -> None:
    pdg, b = reinforce()
    s = schedule_pdg(pdg)
    assert isinstance(s, Schedule) and s.isl_text and "exec" in s.pretty()
    step, g = b.names["step"], b.names["g"]
    outer_step, outer_g = loops_with(s.ast, step)[0], loops_with(s.ast, g)[0]
    assert outer_step is outer_g  # one i loop around everything
    ls, lg = innermost_loop(s.ast, step), innermost_loop(s.ast, g)
    assert ls is not outer_step and lg is not outer_g  # t loops inside the i loop
    assert ls is not lg  # act and learn in separate t loops
    assert not any(isinstance(x, Exec) and x.node == g for x in walk(ls))
    assert preorder_index(s.ast, ls) < preorder_index(s.ast, lg)  # act, then learn
    # the dynamic bound stays a bound symbol in the AST
    assert any(isinstance(x, Loop) and T in _syms(x.cond) for x in walk(s.ast))


def _syms(e) -> set[Sym]:
    from timerl.symbolic import free_symbols

    return set(free_symbols(e))


def test_nstep_reinforce_interleaves() -> None:
    pdg, b = reinforce(n_step=3)
    s = schedule_pdg(pdg)
    step, g = b.names["step"], b.names["g"]
    lg = innermost_loop(s.ast, g)
    assert lg is not loops_with(s.ast, g)[0]  # a t loop, not the i loop
    assert any(isinstance(x, Exec) and x.node == step for x in walk(lg)), s.pretty()


@pytest.mark.parametrize("n_step", [None, 1, 3, 8])
def test_reinforce_verifies(n_step: int | None) -> None:
    pdg, _ = reinforce(n_step=n_step)
    s = schedule_pdg(pdg)
    for tv in (1, 2, 3, 4, 7, 10):
        verify_ast(pdg, s.ast, {T: tv})


def test_verify_ast_rejects_wrong_asts() -> None:
    pdg, b = reinforce()
    s = schedule_pdg(pdg)
    verify_ast(pdg, s.ast, {T: 4})
    step, g = b.names["step"], b.names["g"]
    ls, lg = innermost_loop(s.ast, step), innermost_loop(s.ast, g)

    def swap(n: AstNode) -> AstNode:
        if n is ls:
            return lg
        if n is lg:
            return ls
        if isinstance(n, Seq):
            return Seq(tuple(swap(c) for c in n.children))
        if isinstance(n, Loop):
            return dataclasses.replace(n, body=swap(n.body))
        if isinstance(n, If):
            return If(n.cond, swap(n.then), None if n.else_ is None else swap(n.else_))
        return n

    with pytest.raises(ScheduleError, match="runs before"):
        verify_ast(pdg, swap(s.ast), {T: 4})

    def drop(n: AstNode, nid: int) -> AstNode:
        if isinstance(n, Seq):
            return Seq(tuple(drop(c, nid) for c in n.children if not (isinstance(c, Exec) and c.node == nid)))
        if isinstance(n, Loop):
            return dataclasses.replace(n, body=drop(n.body, nid))
        return n

    with pytest.raises(ScheduleError, match="never runs"):
        verify_ast(pdg, drop(s.ast, b.names["grad"]), {T: 4})
    with pytest.raises(ScheduleError, match="twice"):
        verify_ast(pdg, Seq((s.ast, s.ast)), {T: 2})
    outside = Seq((s.ast, Exec(b.names["grad"], (Sym("I", True),))))
    with pytest.raises(ScheduleError, match="outside its domain"):
        verify_ast(pdg, outside, {T: 2})


def test_ppo_like_graph() -> None:
    pdg, b = ppo_like()
    s = schedule_pdg(pdg)
    step, adv, ep = b.names["step"], b.names["adv"], b.names["ep0"]
    assert any(isinstance(x, Exec) and x.node == step for x in walk(innermost_loop(s.ast, adv)))
    assert innermost_loop(s.ast, ep) is not innermost_loop(s.ast, step)
    for tv in (1, 2, 5, 9):
        verify_ast(pdg, s.ast, {T: tv})


# -- conditions, strides, names -------------------------------------------------------------


@pytest.mark.parametrize("dynamic_i", [False, True])
def test_modulo_condition_runs_every_tenth(dynamic_i: bool) -> None:
    b = Builder()
    b.node("w", (i,))
    b.node("ckpt", (i,), OpKind.SINK, cond=(i + 1) % 10 == 0)
    b.read("w", "w", (i - 1,), cond=i > 0)
    b.read("ckpt", "w", (i,))
    pdg = b.pdg([(i, I)], {} if dynamic_i else {I: 25}, {I} if dynamic_i else ())
    s = schedule_pdg(pdg)
    env = {I: 25}
    ran = [p for nid, p in run_ast(s.ast, env) if nid == b.names["ckpt"]]
    assert ran == [(9,), (19,)]
    verify_ast(pdg, s.ast, env if dynamic_i else {})
    if dynamic_i:
        verify_ast(pdg, s.ast, {I: 9})
        verify_ast(pdg, s.ast, {I: 31})


def test_floor_div_and_min_max_indices() -> None:
    b = Builder()
    b.node("x", (t,))
    b.node("y", (t,))
    b.node("z", (t,))
    b.read("x", "x", (t - 1,), cond=t > 0)
    b.read("y", "x", (t // 2,))
    b.read("z", "y", (Slice(t - t + 0, t + 1),))  # prefix
    b.read("z", "x", (Slice(_max0(t - 3), t + 1),))  # window of 4
    b.read("z", "x", (_minT(t + 2),))  # look-ahead, clamped
    pdg = b.pdg([(t, T)], {}, {T})
    s = schedule_pdg(pdg)
    for tv in (1, 2, 5, 9):
        verify_ast(pdg, s.ast, {T: tv})


def _max0(e):
    from timerl.symbolic import smax

    return smax(e, 0)


def _minT(e):
    from timerl.symbolic import smin

    return smin(e, T - 1)


def test_odd_symbol_names_are_sanitized() -> None:
    mx, mo = Sym("max"), Sym("mod", True)
    s1, s1b = Sym("S1"), Sym("t'", True)
    b = Builder()
    b.node("p", (mx, s1))
    b.node("q", (mx, s1))
    b.read("p", "p", (mx, s1 - 1), cond=s1 > 0)
    b.read("q", "p", (mx, Slice(s1, s1b)))
    pdg = b.pdg([(mx, mo), (s1, s1b)], {mo: 2}, {s1b})
    s = schedule_pdg(pdg)
    assert any(s1b in _syms(x.cond) for x in walk(s.ast) if isinstance(x, Loop))
    for tv in (1, 3, 6):
        verify_ast(pdg, s.ast, {s1b: tv})


def test_zero_dim_only_program() -> None:
    b = Builder()
    b.node("a", ())
    b.node("c", ())
    b.read("c", "a", ())
    pdg = b.pdg([], {}, ())
    s = schedule_pdg(pdg)
    assert run_ast(s.ast, {}) == [(b.names["a"], ()), (b.names["c"], ())]
    verify_ast(pdg, s.ast, {})


def test_recurrence_backwards_in_time() -> None:
    """g[t] = r[t] + g[t+1]: isl runs t downwards after all steps."""
    b = Builder()
    b.node("r", (t,))
    b.node("g", (t,))
    b.read("r", "r", (t - 1,), cond=t > 0)
    b.read("g", "r", (t,))
    b.read("g", "g", (t + 1,), cond=t < T - 1)
    pdg = b.pdg([(t, T)], {}, {T})
    s = schedule_pdg(pdg)
    for tv in (1, 2, 6):
        verify_ast(pdg, s.ast, {T: tv})


# -- errors -----------------------------------------------------------------------------------


def test_non_affine_index_raises() -> None:
    b = Builder()
    b.node("x", (t,))
    b.node("y", (t,))
    b.read("y", "x", (t * t,))
    with pytest.raises(NonAffineIndexError, match=r"t \* t"):
        schedule_pdg(b.pdg([(t, T)], {}, {T}))


def test_division_by_dynamic_bound_raises() -> None:
    b = Builder()
    b.node("x", (t,))
    b.node("y", (t,))
    b.read("y", "x", (t // T,))
    with pytest.raises(NonAffineIndexError, match="t // T"):
        schedule_pdg(b.pdg([(t, T)], {}, {T}))


def test_product_with_static_bound_is_affine() -> None:
    b = Builder()
    b.node("x", (t,))
    b.node("y", (t,), cond=t * T < 20)
    b.read("y", "x", (t,))
    pdg = b.pdg([(t, T)], {T: 5}, ())
    s = schedule_pdg(pdg)
    ran = [p for nid, p in run_ast(s.ast, {}) if nid == b.names["y"]]
    assert ran == [(0,), (1,), (2,), (3,)]
    verify_ast(pdg, s.ast, {})


def test_unknown_bound_raises() -> None:
    b = Builder()
    b.node("x", (t,))
    with pytest.raises(BoundError, match="T"):
        schedule_pdg(b.pdg([(t, T)], {}, ()))


def test_cycle_raises_schedule_error_naming_nodes() -> None:
    b = Builder()
    b.node("src", (t,))
    b.node("x", (t,))
    b.node("y", (t,))
    b.read("x", "src", (t,))
    b.read("x", "y", (t,))
    b.read("y", "x", (t,))
    with pytest.raises(ScheduleError, match="'x'.*'y'|'y'.*'x'") as err:
        schedule_pdg(b.pdg([(t, T)], {}, {T}))
    assert "'src'" not in str(err.value)
    assert "Hint" in str(err.value)


def test_future_read_cycle_raises() -> None:
    b = Builder()
    b.node("x", (t,))
    b.read("x", "x", (t + 1,), cond=t < T - 1)
    b.read("x", "x", (t - 1,), cond=t > 0)
    with pytest.raises(ScheduleError, match="'x'"):
        schedule_pdg(b.pdg([(t, T)], {}, {T}))


def test_unnamed_node_label_in_error() -> None:
    n0 = Node(0, Op.make(OpKind.ADD), (t,), SCALAR, 1, where="prog.py:12")
    e = Edge(0, 0, 0, 0, (t,))
    with pytest.raises(ScheduleError, match="prog.py:12"):
        schedule_pdg(PDG(((t, T),), {0: n0}, (e,), {}, frozenset({T})))

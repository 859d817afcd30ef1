"""Compile-time undefined-read check and the isl expression translation."""

from __future__ import annotations

import pytest
from schedule_pdgs import Builder, T, i, reinforce, t

from timerl.errors import NonAffineIndexError, UndefinedPointError
from timerl.pdg.ops import OpKind
from timerl.schedule.check import check_reads_defined
from timerl.schedule.isl import IslProgram, proximity_index
from timerl.symbolic import Slice, Sym, evaluate, smax, smin


@pytest.mark.parametrize("n_step", [None, 3])
def test_reinforce_reads_are_defined(n_step: int | None) -> None:
    pdg, _ = reinforce(n_step)
    check_reads_defined(pdg)


def test_read_past_the_end_is_undefined() -> None:
    b = Builder()
    b.node("x", (t,))
    b.node("y", (t,))
    b.read("y", "x", (t + 1,))
    with pytest.raises(UndefinedPointError) as err:
        check_reads_defined(b.pdg([(t, T)], {}, {T}))
    msg = str(err.value)
    assert "'x'" in msg and "'y'" in msg and "x[t = T]" in msg and "Hint" in msg


def test_guarded_read_past_the_end_is_fine() -> None:
    b = Builder()
    b.node("x", (t,))
    b.node("y", (t,))
    b.read("y", "x", (t + 1,), cond=t < T - 1)
    check_reads_defined(b.pdg([(t, T)], {}, {T}))


def test_last_point_read_by_scalar_node() -> None:
    """v[] reads x[T - 1]: defined for every T >= 1 (T <= 0 is outside the context)."""
    b = Builder()
    b.node("x", (t,))
    b.node("v", ())
    b.read("v", "x", (T - 1,))
    check_reads_defined(b.pdg([(t, T)], {}, {T}))
    b.read("v", "x", (T - 2,))
    with pytest.raises(UndefinedPointError, match="T = 1"):
        check_reads_defined(b.pdg([(t, T)], {}, {T}))


def _merge_pdg(with_base: bool):
    b = Builder()
    b.node("init", ())
    b.node("f", (t,))
    b.node("x", (t,), OpKind.MERGE)
    b.node("y", (t,))
    if with_base:
        b.read("x", "init", (), cond=t == 0)  # x[0] = init
    b.read("x", "f", (t - 1,), cond=t > 0)  # x[t+1] = f[t]
    b.read("f", "x", (t,))
    b.read("y", "x", (t,))
    return b.pdg([(t, T)], {}, {T})


def test_merge_with_both_branches_is_defined() -> None:
    check_reads_defined(_merge_pdg(with_base=True))


def test_merge_without_base_case_names_t_0() -> None:
    with pytest.raises(UndefinedPointError) as err:
        check_reads_defined(_merge_pdg(with_base=False))
    msg = str(err.value)
    assert "'x'" in msg and "x[t = 0]" in msg and "x[0]" in msg


def test_merge_branch_reading_outside_its_source() -> None:
    """x[t] = a[t + 1] (unguarded): x is undefined at T - 1, a reader of x[T - 1] fails."""
    b = Builder()
    b.node("a", (t,))
    b.node("x", (t,), OpKind.MERGE)
    b.node("y", (t,))
    b.node("z", (t,))
    b.read("x", "a", (t + 1,))
    b.read("y", "x", (t,), cond=t < T - 1)
    check_reads_defined(b.pdg([(t, T)], {}, {T}))
    b.read("z", "x", (Slice(t, T),))
    with pytest.raises(UndefinedPointError, match=r"x\[t = -1 \+ T\]"):
        check_reads_defined(b.pdg([(t, T)], {}, {T}))


def test_static_bounds_are_substituted() -> None:
    b = Builder()
    b.node("x", (i,))
    b.node("y", (i,))
    b.read("y", "x", (i + 2,), cond=i < 3)
    check_reads_defined(b.pdg([(i, Sym("I", True))], {Sym("I", True): 5}, ()))
    b2 = Builder()
    b2.node("x", (i,))
    b2.node("y", (i,))
    b2.read("y", "x", (i + 2,), cond=i < 4)
    with pytest.raises(UndefinedPointError, match=r"x\[i = 5\]"):
        check_reads_defined(b2.pdg([(i, Sym("I", True))], {Sym("I", True): 5}, ()))


# -- expression translation --------------------------------------------------------------


CONDS = [
    (t + 1) % 10 == 0,
    (t - 3) % 4 == 1,
    t // 3 == 2,
    (-t) // 4 == -2,
    t // -3 == -2,
    t % -4 == -1,
    smin(t + 2, 7) == 7,
    smax(t - 3, 2) <= 4,
    (t < 3) | (t >= 17),
    ~((t > 2) & (t < 15)),
    t != 5,
    3 * t - 2 * (t // 2) >= 10,
    (t * 2 < 9) == (t > 1),
]


@pytest.mark.parametrize("k", range(len(CONDS)))
def test_conditions_translate_exactly(k: int) -> None:
    cond = CONDS[k]
    b = Builder()
    b.node("x", (t,), cond=cond)
    pdg = b.pdg([(t, Sym("T", True))], {Sym("T", True): 20}, ())
    prog = IslProgram(pdg)
    got = prog.points(prog.node_domain(0))
    want = [(v,) for v in range(20) if evaluate(cond, {t: v})]
    assert got == want, (str(cond), prog.domain_text(pdg.nodes[0]))


def test_non_affine_condition_names_expression() -> None:
    u = Sym("u")
    b = Builder()
    b.node("x", (t, u), cond=t * u < 3)
    pdg = b.pdg([(t, T), (u, Sym("U", True))], {T: 4}, {Sym("U", True)})
    with pytest.raises(NonAffineIndexError, match=r"t \* u"):
        IslProgram(pdg).domain()


def test_proximity_forms() -> None:
    assert str(proximity_index(Slice(t, T))) == str(T - 1)
    assert str(proximity_index(Slice(t, smin(t + 3, T)))) == str(t + 2)
    assert str(proximity_index(Slice(smax(t - 3, 0), t + 1))) == str(t)
    assert proximity_index(t + 1) is t + 1


def test_legality_check_detects_reversed_dependences() -> None:
    pdg, _ = reinforce(3)
    prog = IslProgram(pdg)
    val = prog.dependences()
    sched = prog.compute_schedule(val, prog.dependences(proximity=True))
    assert sched is not None
    assert prog.violated(sched, val).is_empty()
    assert not prog.violated(sched, val.reverse()).is_empty()

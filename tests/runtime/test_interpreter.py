"""The AST interpreter on hand-built PDGs and schedules, checked against the reference evaluator."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from helpers_rt import assert_matches_reference, interpret
from runtime_pdgs import (
    Builder,
    I,
    Program,
    T,
    batched_program,
    c0,
    c1,
    chain_program,
    cumsum_program,
    episode_program,
    ex,
    free,
    loop,
    select_program,
    t,
)

from timerl.backends import AbstractBackend
from timerl.errors import BoundError, RuntimeExecutionError, ScheduleError
from timerl.pdg.ops import DType, OpKind
from timerl.runtime.interpreter import Executor
from timerl.runtime.reference import reference_evaluate
from timerl.schedule.ast import If, Seq
from timerl.symbolic import TRUE, Sym


def run(prog: Program, backend: AbstractBackend, seed: int = 0, block_store: bool = True) -> Executor:
    e = interpret(prog.pdg, prog.ast, backend, seed=seed, block_store=block_store)
    e.execute()
    return e


# -- static programs ----------------------------------------------------------------------------
def test_cumsum_merge_and_slices(backend: AbstractBackend) -> None:
    prog = cumsum_program(6)
    e = run(prog, backend)
    ids = prog.ids
    x = [float(e.value(ids["x"], (k,))) for k in range(6)]
    assert x == [5, 6, 7, 8, 9, 10]
    for k in range(6):
        assert float(e.value(ids["s"], (k,))) == sum(x[k:])
        assert float(e.value(ids["p"], (k,))) == sum(x[:k])  # p[0] reads the empty slice x[0:0]
    assert e.value(ids["x"], (0,)).dtype == np.float32
    # the sink saw every point once, in schedule order, with host values
    assert [pt for pt, _ in prog.calls] == [{"t": k} for k in range(6)]
    assert [float(v) for _, v in prog.calls] == [sum(x[k:]) for k in range(6)]
    assert all(isinstance(v, np.ndarray) for _, v in prog.calls)
    prog.calls.clear()
    assert_matches_reference(e, reference_evaluate(prog.pdg, backend), prog.pdg, min_points=26)
    assert [pt for pt, _ in prog.calls] == [{"t": k} for k in range(6)]


def test_select_edge(backend: AbstractBackend) -> None:
    prog = select_program(5)
    e = run(prog, backend)
    for k in range(5):
        want = sum((k - s) * 10 + s for s in range(k + 1))
        assert float(e.value(prog.ids["dx"], (k,))) == want
    assert e.value(prog.ids["vj"], (1,)).shape == (4,)
    assert_matches_reference(e, reference_evaluate(prog.pdg, backend), prog.pdg, min_points=10)


def test_batched_mixed_inputs(backend: AbstractBackend) -> None:
    prog = batched_program(3)
    e = run(prog, backend, seed=7)
    ids = prog.ids
    u = [e.value(ids["u"], (k,)) for k in range(3)]
    assert u[0].shape == (4, 3) and u[0].dtype == np.float32
    assert 0 <= min(x.min() for x in u) and max(x.max() for x in u) < 1
    ev = e.value(ids["ev"], (2,))
    assert ev.shape == (4,) and np.all(ev == 4.0)
    z2 = [x * np.array([1, 2, 3], np.float32) + 2 * k for k, x in enumerate(u)]
    for k in range(3):
        np.testing.assert_allclose(e.value(ids["z2"], (k,)), z2[k], rtol=1e-6)
        h = e.value(ids["h"], (k,))
        assert h.shape == (4,)
        np.testing.assert_allclose(h, np.stack(z2[: k + 1], axis=1).sum(axis=(1, 2)), rtol=1e-5)
    # z is read only by z2 at its own point: inside one fused region with z2 and h (ev, an
    # EVAL_SYMBOL between them in the AST, runs first), so it is not stored
    assert_matches_reference(e, reference_evaluate(prog.pdg, backend, seed=7), prog.pdg, min_points=13)


def test_random_is_deterministic_per_point(backend: AbstractBackend) -> None:
    fwd = run(batched_program(3), backend, seed=3)
    rev = run(batched_program(3, reverse=True), backend, seed=3)  # draws in the opposite order
    other = run(batched_program(3), backend, seed=4)
    u = batched_program().ids["u"]
    for k in range(3):
        np.testing.assert_array_equal(fwd.value(u, (k,)), rev.value(u, (k,)))
        assert not np.array_equal(fwd.value(u, (k,)), other.value(u, (k,)))
    assert not np.array_equal(fwd.value(u, (0,)), fwd.value(u, (1,)))


def test_dealloc_frees_and_memory_stats(backend: AbstractBackend) -> None:
    """Point-store accounting (the block store's is in test_block_store.py)."""
    keep = run(cumsum_program(6), backend, block_store=False)
    prog = cumsum_program(6, dealloc=True)
    e = run(prog, backend, block_store=False)
    y = prog.ids["y"]
    assert e.points(y) == [(5,)]  # y[0..4] freed once x[t+1] read them
    with pytest.raises(KeyError, match="never run or freed"):
        e.value(y, (0,))
    a, b = keep.memory_stats(), e.memory_stats()
    assert a.live_bytes == a.peak_bytes == 26 * 4
    assert b.live_bytes == a.live_bytes - 5 * 4
    assert b.live_bytes <= b.peak_bytes < a.peak_bytes
    e.store.free(prog.ids["x"], (0,))  # live bytes drop, the peak stays
    assert e.memory_stats().live_bytes == b.live_bytes - 4 and e.memory_stats().peak_bytes == b.peak_bytes
    assert b.live_points == a.live_points - 5
    assert_matches_reference(e, reference_evaluate(prog.pdg, backend), prog.pdg, min_points=20)


# -- dynamic bounds -----------------------------------------------------------------------------
def _returns(ep_len: tuple[int, ...]) -> dict[str, dict[tuple[int, int], float]]:
    out: dict[str, dict[tuple[int, int], float]] = {"g": {}, "ng": {}, "gr": {}}
    for ep, n in enumerate(ep_len):
        r = [0.5 * (100 * ep + k) for k in range(n)]
        acc = 0.0
        for k in reversed(range(n)):
            acc = r[k] + 0.9 * acc
            out["gr"][(ep, k)] = acc
            out["g"][(ep, k)] = sum(r[k:])
            out["ng"][(ep, k)] = sum(r[k : k + 2])
    return out


@pytest.mark.parametrize("schedule", ["mc", "rev", "nstep", "split"])
def test_dynamic_episode_lengths(backend: AbstractBackend, schedule: str) -> None:
    ep_len = (5, 3, 1, 4)
    prog = episode_program(ep_len, schedule)
    e = run(prog, backend)
    assert e.bound_values(T) == {(k,): n for k, n in enumerate(ep_len)}
    steps = [c[1:] for c in prog.calls if c[0] == "step"]
    assert steps == [(ep, k) for ep, n in enumerate(ep_len) for k in range(n)]  # no step past done
    sinks = [c for c in prog.calls if c[0] == "sink"]
    assert [c[1] for c in sinks] == list(range(len(ep_len)))
    if schedule != "split":  # episodes alternate reset/steps/sink
        assert [c[0] for c in prog.calls if c[0] != "step"] == ["reset", "sink"] * len(ep_len)
    np.testing.assert_allclose(
        [c[2] for c in sinks], [sum(0.5 * (100 * ep + k) for k in range(n)) for ep, n in enumerate(ep_len)]
    )
    name = {"mc": "g", "rev": "gr", "nstep": "ng", "split": "g"}[schedule]
    want = _returns(ep_len)[name]
    got = {p: float(e.value(prog.ids[name], p)) for p in e.points(prog.ids[name])}
    assert got.keys() == want.keys()
    np.testing.assert_allclose([got[p] for p in sorted(want)], [want[p] for p in sorted(want)], rtol=1e-5)
    acting_calls = [c for c in prog.calls if c[0] != "sink"]
    prog.calls.clear()
    ref = reference_evaluate(prog.pdg, backend)
    assert [c for c in prog.calls if c[0] != "sink"] == acting_calls  # the same env calls, in order
    assert_matches_reference(e, ref, prog.pdg, min_points=40)


def test_bound_needed_before_known(backend: AbstractBackend) -> None:
    prog = episode_program((3, 2), "too_early")
    with pytest.raises(BoundError, match="before T is known"):
        run(prog, backend)


def test_loop_on_unknown_bound_without_its_setter(backend: AbstractBackend) -> None:
    prog = episode_program((3, 2), "stuck")
    with pytest.raises(BoundError, match="not found inside the loop"):
        run(prog, backend)


def test_bound_resets_per_episode_and_rerun(backend: AbstractBackend) -> None:
    prog = episode_program((2, 6), "nstep")
    e = interpret(prog.pdg, prog.ast, backend)
    e.execute()
    first = e.bound_values(T)
    e.execute()  # a second run starts from fresh stores and bounds
    assert e.bound_values(T) == first == {(0,): 2, (1,): 6}


# -- errors -------------------------------------------------------------------------------------
def test_udf_error_names_node_and_point(backend: AbstractBackend) -> None:
    prog = episode_program((2, 2), "mc", fail_reset_at=1)
    with pytest.raises(RuntimeExecutionError, match=r"'reset'.*simulator crashed.*'i': 1") as info:
        run(prog, backend)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(RuntimeExecutionError, match="'reset'"):
        reference_evaluate(prog.pdg, backend)


def test_sink_error_is_wrapped(backend: AbstractBackend) -> None:
    def bad(v: np.ndarray, pt: dict[str, int]) -> None:
        raise KeyError("logger closed")

    prog = cumsum_program(3, sink_fn=bad)
    with pytest.raises(RuntimeExecutionError, match="'sink'.*logger closed") as info:
        run(prog, backend)
    assert isinstance(info.value.__cause__, KeyError)


def test_read_before_write_is_reported(backend: AbstractBackend) -> None:
    prog = cumsum_program(3)
    ids = prog.ids
    ast = Seq((ex(ids["c"]), ex(ids["one"]), ex(ids["y"], 0)))
    with pytest.raises(RuntimeExecutionError, match="'y'.*reads 'x' at \\(0,\\).*not computed"):
        interpret(prog.pdg, ast, backend).execute()


def test_merge_without_branch(backend: AbstractBackend) -> None:
    prog = cumsum_program(3)
    ids = prog.ids
    ast = Seq((ex(ids["c"]), ex(ids["one"]), ex(ids["x"], -1)))
    with pytest.raises(RuntimeExecutionError, match="'x'.*no branch"):
        interpret(prog.pdg, ast, backend).execute()


def test_loop_guard(backend: AbstractBackend) -> None:
    prog = cumsum_program(3)
    ast = Seq((ex(prog.ids["c"]), loop(c0, 0, TRUE, ex(prog.ids["c"]))))
    e = interpret(prog.pdg, ast, backend)
    e.max_loop_iterations = 50
    with pytest.raises(RuntimeExecutionError, match="more than 50 iterations"):
        e.execute()


def test_bad_schedules_are_rejected_early(backend: AbstractBackend) -> None:
    prog = cumsum_program(3)
    with pytest.raises(ScheduleError, match="unknown symbol"):
        interpret(prog.pdg, ex(prog.ids["x"], Sym("_c9")), backend)
    with pytest.raises(ScheduleError, match="2 coordinates"):
        interpret(prog.pdg, ex(prog.ids["x"], 0, 0), backend)
    with pytest.raises(ScheduleError, match="not in the PDG"):
        interpret(prog.pdg, ex(99), backend)


def test_dynamic_bound_without_setter(backend: AbstractBackend) -> None:
    b = Builder()
    b.add(OpKind.EVAL_SYMBOL, (t,), name="e", expr=t, dtype=DType.float32)
    pdg = b.pdg(((t, T),), {}, frozenset({T}))
    with pytest.raises(BoundError, match="no SET_SYMBOL"):
        interpret(pdg, ex(0, 0), backend)


# -- speed --------------------------------------------------------------------------------------
def test_long_chain(backend: AbstractBackend) -> None:
    """A 3000-step chain runs every statement once and keeps only the last value (its rate
    is logged; speed is measured in ``benchmarks/``, not asserted here)."""
    prog = chain_program(3000)
    e = interpret(prog.pdg, prog.ast, backend)
    t0 = time.perf_counter()
    e.execute()
    dt = time.perf_counter() - t0
    assert e.exec_count == 2 + 2 * 3000
    assert float(e.value(prog.ids["y"], (2999,))) == 5 + 3000
    assert e.points(prog.ids["y"]) == [(2999,)]
    logging.getLogger(__name__).info("%s: %.0f execs/s", backend.name, e.exec_count / dt)


# -- with the real scheduler ---------------------------------------------------------------------
@pytest.mark.parametrize("which", ["cumsum", "select", "batched", "episode"])
def test_schedules_from_the_scheduler(backend: AbstractBackend, which: str) -> None:
    """The isl scheduler's ASTs (dynamic T included) run and agree with the reference."""
    scheduler = pytest.importorskip("timerl.schedule.scheduler")
    prog = {
        "cumsum": cumsum_program,
        "select": select_program,
        "batched": batched_program,
        "episode": lambda: episode_program((5, 3, 1, 4)),
    }[which]()
    sched = scheduler.schedule_pdg(prog.pdg)
    e = interpret(prog.pdg, sched.ast, backend)
    e.execute()
    calls = list(prog.calls)
    prog.calls.clear()
    assert_matches_reference(e, reference_evaluate(prog.pdg, backend), prog.pdg, min_points=10)
    assert calls == prog.calls


def test_memory_stats_per_tensor_names_nodes(backend: AbstractBackend) -> None:
    """The executor's stats list the largest tensors by label; their live bytes add up."""
    prog = cumsum_program(6)
    e = run(prog, backend, block_store=False)
    s = e.memory_stats(top=100)
    assert s.pool("device").live_bytes == s.live_bytes and s.pool("host").peak_bytes == 0
    assert sum(t.live_bytes for t in s.tensors) == s.live_bytes
    labels = {t.node: t.label for t in s.tensors}
    assert labels[prog.ids["y"]] == e.pdg.nodes[prog.ids["y"]].label
    assert len(e.memory_stats(top=1).tensors) == 1


def test_free_points_use_their_own_episode_bound(backend: AbstractBackend) -> None:
    """Issue 15 fuzz seed 6038: every episode acts in one ``i`` loop, then a second ``i`` loop
    frees each episode's points through ``T`` (``free step(c0, T - 1 - c1)`` for ``c1 < T``).
    The frees' loop bound and points must use episode ``c0``'s ``T``, not the last episode's
    (which freed the wrong points, or too few)."""
    ep_len = (5, 3, 1)
    prog = episode_program(ep_len, "split")
    o, step, g = prog.ids["o"], prog.ids["step"], prog.ids["g"]
    acting = (ex(o, c0, c1), ex(step, c0, c1), ex(prog.ids["done"], c0, c1))
    act = loop(c0, 0, c0 < I, ex(prog.ids["reset"], c0), loop(c1, 0, c1 < T, *acting))
    learn = loop(
        c0,
        0,
        c0 < I,
        loop(c1, 0, c1 < T, ex(g, c0, c1)),
        ex(prog.ids["tot"], c0),
        ex(prog.ids["sink"], c0),
        loop(c1, 0, c1 < T, free(step, c0, T - 1 - c1), If(c1 + 1 < T, free(o, c0, T - 1 - c1))),
    )
    e = run(Program(prog.pdg, Seq((act, learn)), prog.ids), backend)
    assert not e.points(step)
    assert e.points(o) == [(k, 0) for k in range(len(ep_len))]

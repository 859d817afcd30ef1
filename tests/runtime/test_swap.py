"""Swapping (``CompileOptions(swap=True)``, ``timerl/schedule/swap.py``) run end to end, and the
AST post-processing of memory statements.

A Monte-Carlo program over a dynamic episode length: observations of ``D`` floats are read
while acting (by the step) and again after the episode ends (``(o * g).sum()`` with the
return ``g[t] = r[t:T].discounted_sum``). With swapping each observation is offloaded to
the host pool after the step and fetched back for learning: the device pool's peak stays
small, the host pool holds the episode, and every sunk value equals the run without
swapping bit for bit (swapping moves data, it does not change arithmetic), on both
backends, and the reference evaluator's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, Executor, build_pdg
from timerl.errors import MemoryBudgetError, RuntimeExecutionError
from timerl.runtime.reference import reference_evaluate
from timerl.runtime.store import PointStore
from timerl.schedule.ast import Dealloc, Exec, Fetch, Loop, Offload, Seq, walk
from timerl.schedule.swap import batch_memory_loops, drop_redundant_moves
from timerl.symbolic import Const, Lt, Slice, Sym

D = 256  # floats per observation


def mc_program(
    length: int, sink: Any, d: int = D, episodes: int = 2, static: bool = False
) -> tuple[trl.Context, dict]:
    """Episodes of ``length`` steps (a dynamic ``T`` found by the step's done flag, or
    ``static``); sinks ``(o[t] * r[t:T].discounted_sum(0.9)).sum()``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        o = trl.empty((d,), domain=(i, t), name="obs")
        o[i, 0] = trl.zeros((d,))

        def step(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
            nxt = ins[0] * np.float32(0.5) + np.float32(pt["t"] + pt["i"])
            return [nxt, np.array(pt["t"] + 1 == length)]

        nxt, done = trl.udf(
            step, [((d,), trl.float32), ((), trl.bool_)], domain=(i, t), inputs=[o], name="step"
        )
        o[i, t + 1] = nxt
        r = o[i, t].mean(0) + 1.0
        g = r[i, t:T].discounted_sum(0.9)
        (o * g).sum(0).sink(sink)
    return ctx, {I: episodes, T: length if static else done}


def _run(program: Any, length: int, backend: str, **options: Any) -> tuple[dict, Any]:
    got: dict[tuple[int, int], float] = {}
    ctx, bounds = program(length, lambda v, p: got.__setitem__((p["i"], p["t"]), float(v)))
    ex = ctx.compile(bounds, backend=backend, **options)
    ex.execute()
    return got, ex


SWAP = {"swap": True, "swap_threshold": 512}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_swap_moves_observations_to_the_host_and_keeps_every_value(backend: str) -> None:
    # swap=True keeps learning per step (no vectorize_dynamic): compare with the same program
    runs = {(L, s): _run(mc_program, L, backend, swap=s, swap_threshold=512, memory_timeline=True,
                         vectorize_dynamic=False)
            for L in (20, 200) for s in (False, True)}  # fmt: skip
    for L in (20, 200):
        assert runs[(L, True)][0] == runs[(L, False)][0]  # bit for bit
        assert len(runs[(L, True)][0]) == 2 * L
    ast = runs[(20, True)][1].schedule.ast
    assert any(isinstance(s, Offload) for s in walk(ast)) and any(isinstance(s, Fetch) for s in walk(ast))
    assert not any(isinstance(s, (Offload, Fetch)) for s in walk(runs[(20, False)][1].schedule.ast))
    dev = {k: ex.memory_stats().pool("device").peak_bytes for k, (_, ex) in runs.items()}
    host = {k: ex.memory_stats().pool("host").peak_bytes for k, (_, ex) in runs.items()}
    # without swapping the device holds every observation of an episode; with it, a few
    assert dev[(200, False)] > 5 * dev[(20, False)]
    assert dev[(200, True)] < 2 * dev[(20, True)] and dev[(200, True)] < dev[(200, False)] / 10
    assert host[(200, True)] >= 200 * D * 4 and host[(200, False)] == 0
    tl = runs[(20, True)][1].memory_timeline()
    assert max(tl.pool("host")) == host[(20, True)] and tl.pool("host")[-1] == 0
    assert max(tl.pool("device")) == dev[(20, True)]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_swap_equals_reference_evaluator(backend: str) -> None:
    got, ex = _run(mc_program, 13, backend, free_iterations=False, **SWAP)
    assert ex.memory_stats().pool("host").peak_bytes > 0
    want: dict[tuple[int, int], float] = {}
    ctx, bounds = mc_program(13, lambda v, p: want.__setitem__((p["i"], p["t"]), float(v)))
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    assert sorted(got) == sorted(want) and len(got) == 26
    np.testing.assert_allclose([got[k] for k in sorted(got)], [want[k] for k in sorted(got)], rtol=1e-6)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_nstep_program_same_with_and_without_swap(backend: str) -> None:
    from tests.runtime.test_dealloc import nstep_program

    def prog(length: int, sink: Any) -> tuple[trl.Context, dict]:
        return nstep_program(length, 8, sink)

    on, ex = _run(prog, 30, backend, **SWAP)
    assert on == _run(prog, 30, backend)[0]
    assert len(on) == 60


def test_a_read_of_an_offloaded_point_not_fetched_is_an_internal_error() -> None:
    """The schedule's fetches removed: the learner's read names the offloaded point."""
    got: dict = {}
    ctx, bounds = mc_program(6, lambda v, p: got.__setitem__((p["i"], p["t"]), float(v)))
    ex = ctx.compile(bounds, backend="torch", **SWAP)

    def strip(n: Any) -> Any:
        if isinstance(n, Seq):
            return Seq(tuple(strip(c) for c in n.children if not isinstance(c, Fetch)))
        if isinstance(n, Loop):
            return replace(n, body=strip(n.body))
        return n

    bad = Executor(ex.pdg, replace(ex.schedule, ast=strip(ex.schedule.ast)), ex.backend, ex.options)
    with pytest.raises(RuntimeExecutionError, match="offloaded to the host pool and was not fetched"):
        bad.execute()


def test_store_offload_and_fetch_move_bytes_between_pools() -> None:
    be = get_backend("torch")
    store = PointStore(be.nbytes, be.to_host, be.from_host, be.host_nbytes)
    store.declare(0, 1)
    store.record_timeline()
    x = be.from_numpy(np.arange(8, dtype=np.float32))
    store.put(0, 0, (1, 2), x)
    assert store.offload(0, [(1, 2)]) == 32
    assert not store.has(0, 0, (1, 2)) and store.is_offloaded(0, (1, 2))
    st = store.stats()
    assert (st.pool("device").live_bytes, st.pool("host").live_bytes, st.live_bytes) == (0, 32, 32)
    store.fetch(0, [(1, 2)])
    store.fetch(0, [(1, 2)])  # already on the device: nothing to do
    np.testing.assert_array_equal(be.to_numpy(store.get(0, 0, (1, 2))), np.arange(8, dtype=np.float32))
    assert store.stats().pool("host").live_bytes == 0 and store.stats().pool("device").live_bytes == 32
    store.offload(0, [(1, 2)])
    assert store.free(0, (1, 2)) == 32 and store.stats().live_bytes == 0  # a free drops the host copy
    with pytest.raises(KeyError):
        store.fetch(0, [(1, 2)])
    tl = store.timeline()
    assert tl.pool("host") == (0, 0, 32, 0, 32, 0)  # one sample per move
    assert tl.total() == (0, 32, 32, 32, 32, 0)


# -- post-processing ----------------------------------------------------------------------------
c0, c1 = Sym("_c0"), Sym("_c1")


def test_offload_then_fetch_of_the_same_point_is_dropped() -> None:
    seq = Seq((Exec(1, (c0,)), Offload(1, (c0,)), Exec(2, (c0,)), Fetch(1, (c0,)), Exec(3, (c0,))))
    assert drop_redundant_moves(seq) == Seq((Exec(1, (c0,)), Exec(2, (c0,)), Exec(3, (c0,))))
    # another point, or a loop between: kept
    other = Seq((Offload(1, (c0,)), Fetch(1, (c0 + 1,))))
    assert drop_redundant_moves(other) == other
    loop = Loop(c1, Const(0), Lt(c1, Const(3)), 1, Exec(2, (c1,)))
    kept = Seq((Offload(1, (c0,)), loop, Fetch(1, (c0,))))
    assert drop_redundant_moves(kept) == kept
    # an offload followed by the free: the free alone; a fetch of a point fetched already: once
    assert drop_redundant_moves(Seq((Offload(1, (c0,)), Dealloc(1, (c0,))))) == Dealloc(1, (c0,))
    twice = Seq((Fetch(1, (c0,)), Exec(2, (c0,)), Fetch(1, (c0,)), Exec(3, (c0,))))
    assert drop_redundant_moves(twice) == Seq((Fetch(1, (c0,)), Exec(2, (c0,)), Exec(3, (c0,))))


def test_memory_only_static_loops_become_batched_statements() -> None:
    body = Seq((Dealloc(1, (c0, c1)), Offload(2, (c1 + 1, c0))))
    loop = Loop(c1, Const(0), Lt(c1, Const(8)), 1, body)
    got = batch_memory_loops(loop)
    assert got == Seq(
        (Dealloc(1, (c0, Slice(Const(0), Const(8)))), Offload(2, (Slice(Const(1), Const(9)), c0)))
    )
    # a loop with an exec, over a dynamic bound, or naming the counter twice: unchanged
    T = Sym("T")
    for keep in (
        Loop(c1, Const(0), Lt(c1, Const(8)), 1, Seq((Dealloc(1, (c0, c1)), Exec(3, (c1,))))),
        Loop(c1, Const(0), Lt(c1, T), 1, Dealloc(1, (c0, c1))),
        Loop(c1, Const(0), Lt(c1, Const(8)), 1, Dealloc(1, (c1, c1))),
        Loop(c1, Const(0), Lt(c1, Const(8)), 1, Dealloc(1, (c1, T + Const(-1)))),
    ):
        assert batch_memory_loops(keep, frozenset({T})) == keep


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_batched_frees_run_as_the_loop_did(backend: str) -> None:
    """A program whose frees of a static loop come out batched: same values, same store."""
    ctx = trl.Context(dims=("i", "t"))
    got: dict = {}
    with ctx as ((i, I), (t, T)):
        x = trl.as_tensor(t, domain=(i, t)).cast(trl.float32) * 2.0 + trl.as_tensor(i, domain=(i, t)).cast(
            trl.float32
        )
        s = x[i, 0:T].sum(0)
        s.sink(lambda v, p: got.__setitem__(p["i"], float(v)))
    bounds = {I: 3, T: 5}
    ex = ctx.compile(bounds, backend=backend, vectorize=False, vectorize_time=False, block_store=False)
    ex.execute()
    batched = [
        s
        for s in walk(ex.schedule.ast)
        if isinstance(s, Dealloc) and any(isinstance(c, Slice) for c in s.point)
    ]
    assert batched, ex.schedule.pretty()
    assert got == {k: float(sum(2 * t + k for t in range(5))) for k in range(3)}
    assert ex.memory_stats().live_points <= 3


# -- budget --------------------------------------------------------------------------------------
def _static(length: int, sink: Any, d: int = D) -> tuple[trl.Context, dict]:
    """Observations made from a small recurrent state (not themselves recurrent: the
    budget's estimate leaves out a ``MERGE``'s points, which hold its branch's tensor), a
    static ``T``."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        k = trl.empty((), domain=(i, t), name="state")  # a small recurrent state: acting runs forward
        k[i, 0] = trl.zeros(())
        k[i, t + 1] = k[i, t] + 1.0

        def observe(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
            return [np.full((d,), ins[0] * np.float32(0.25) + np.float32(pt["i"]), np.float32)]

        (o,) = trl.udf(observe, [((d,), trl.float32)], domain=(i, t), inputs=[k], name="observe")
        r = o[i, t].mean(0) + 1.0
        g = r[i, t:T].discounted_sum(0.9)
        (o * g).sum(0).sink(sink)
    return ctx, {I: 2, T: length}


def test_budget_turns_swapping_on_when_frees_do_not_fit() -> None:
    """A device budget between the estimated peaks with and without swapping: the budget
    turns swapping on (same values); below the peak with swapping: the error says so."""

    nv = {"vectorize_time": False}  # learning per step (vectorized, it reads every observation at once)
    plain, ex0 = _run(_static, 40, "torch", **nv)
    _, exs = _run(_static, 40, "torch", **nv, **SWAP)
    e0 = ex0.plan.peak.peak_bytes
    e1 = exs.plan.peak.peak_bytes
    assert e1 < e0
    got, ex = _run(_static, 40, "torch", memory_budget=(e0 + e1) // 2, **nv)
    assert ex.options.swap and got == plain
    assert any(isinstance(s, Offload) for s in walk(ex.schedule.ast))
    assert ex.memory_stats().pool("device").peak_bytes < ex0.memory_stats().pool("device").peak_bytes
    with pytest.raises(MemoryBudgetError, match="with deallocation and swapping holds"):
        _run(_static, 40, "torch", memory_budget=max(1, e1 // 4), **nv)


def test_plot_schedule_lists_offloads_and_fetches(tmp_path: Any) -> None:
    _, ex = _run(mc_program, 5, "torch", **SWAP)
    txt, png = ex.plot_schedule(tmp_path / "sched")
    text = txt.read_text()
    assert "offload %" in text and "fetch %" in text and "offloads/fetches" in text
    assert png.exists()

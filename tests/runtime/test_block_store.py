"""The block store: which tensors get one, its table and accounting, and that programs give
the same values with and without it (and as the reference evaluator)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from helpers_rt import assert_matches_reference, interpret
from runtime_pdgs import (
    Program,
    T,
    batched_program,
    cumsum_program,
    episode_program,
    select_program,
    t,
)

from timerl.backends import AbstractBackend
from timerl.pdg.ops import OpKind
from timerl.plan.storage import (
    DEFAULT_BLOCK,
    MAX_BLOCK,
    MIN_BLOCK,
    BlockSpec,
    block_rows,
    plan_block_storage,
    slice_extent,
)
from timerl.runtime.block_store import BlockTable
from timerl.runtime.interpreter import Executor
from timerl.runtime.reference import reference_evaluate
from timerl.runtime.store import PointStore
from timerl.symbolic import ZERO, Slice, Sym, lift, smin


def run(prog: Program, backend: AbstractBackend, block_store: bool, **kw) -> Executor:
    e = interpret(prog.pdg, prog.ast, backend, block_store=block_store, **kw)
    e.execute()
    return e


def assert_same_values(a: Executor, b: Executor, min_points: int) -> None:
    """Every stored value of ``a`` equals ``b``'s bit for bit (shapes and dtypes too)."""
    n = 0
    for nid, node in a.pdg.nodes.items():
        for oid in range(len(node.outputs)):
            assert a.points(nid, oid) == b.points(nid, oid), node.label
            for p in a.points(nid, oid):
                x, y = a.value(nid, p, oid), b.value(nid, p, oid)
                assert x.shape == y.shape and x.dtype == y.dtype, (node.label, p)
                np.testing.assert_array_equal(x, y, err_msg=f"{node.label} out {oid} at {p}")
                n += 1
    assert n >= min_points


# -- the storage decision ------------------------------------------------------------------------
def test_slice_extent() -> None:
    n = Sym("n")
    assert slice_extent(Slice(t, smin(t + 3, T)), None) == 3
    assert slice_extent(Slice(t, smin(t + 3, T)), 2) == 2
    assert slice_extent(Slice(t, T), None) is None
    assert slice_extent(Slice(ZERO, T), 6) == 6
    assert slice_extent(Slice(t - 4, t + 1), None) == 5
    assert slice_extent(Slice(lift(0), n), None) is None


def test_block_size() -> None:
    assert block_rows(3, None) == MIN_BLOCK  # a window of 3: small blocks
    assert block_rows(3, 2) == 2
    assert block_rows(500, 500) == 500  # 0:T with a static T: one block per key
    assert block_rows(None, None) == DEFAULT_BLOCK
    assert block_rows(10**6, 10**6) == MAX_BLOCK


def test_plan_picks_the_slice_read_tensors() -> None:
    prog = cumsum_program(6)
    plan = plan_block_storage(prog.pdg)
    x = prog.ids["x"]
    assert set(plan) == {(x, 0)}  # x is read by x[t:T] and x[0:t]; y, s, p, the consts by points
    assert plan[(x, 0)] == BlockSpec(x, 0, 0, t, 6, 6, 0)

    prog = episode_program((3, 2), "mc", window=3)
    plan = plan_block_storage(prog.pdg)
    step = prog.ids["step"]
    # rewards (output 1) are sliced over t; observations and done flags only point-read
    assert set(plan) == {(step, 1)}
    spec = plan[(step, 1)]
    assert (spec.axis, spec.dim.name) == (1, "t")
    assert spec.extent is None and spec.rows == DEFAULT_BLOCK  # r[t:T], r[0:T]: T is dynamic

    prog = batched_program(3)
    plan = plan_block_storage(prog.pdg)
    assert set(plan) == {(prog.ids["z2"], 0)}
    assert plan[(prog.ids["z2"], 0)].row_axis == 1  # rows stack after the batch dim

    prog = episode_program((3, 2), "mc")  # without the reads at every t, r[0:T] is read once per i
    pdg = prog.pdg
    kept = tuple(e for e in pdg.edges if pdg.nodes[e.sink].name in ("tot", "sink") or e.oid != 1)
    assert (prog.ids["step"], 1) not in plan_block_storage(pdg.with_(edges=kept))

    prog = select_program(5)  # a select edge and a symbolic per-point shape: point store
    assert plan_block_storage(prog.pdg) == {}


def test_disjoint_blocks_of_an_incrementalized_sum_are_not_block_stored() -> None:
    """``x[i, 4*di : 4*di + 4]`` (incrementalized blocks) reads each point once: no block store,
    unlike ``x[i, di : di + 4]`` (overlapping windows)."""
    import timerl as trl
    from timerl.compile import CompileOptions, build_pdg

    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        x = (
            trl.const(np.linspace(-1, 1, 64).astype(np.float32)) * trl.as_tensor(t) + trl.as_tensor(i)
        ).tanh()
        x[i, 0:T].sum(0).sink(lambda v, p: None)
    pdg = build_pdg(ctx, {I: 2, T: 16}, CompileOptions(vectorize_time=False, incrementalize=1024))
    (read,) = [e for e in pdg.edges if any(d.name.startswith("di") for d in pdg.nodes[e.sink].domain)
               and pdg.nodes[e.src].op.kind is OpKind.TANH]  # fmt: skip
    assert str(read.phi[-1]) == "4 * di0:(4 * di0) + 4", read
    assert plan_block_storage(pdg) == {}
    di = next(d for d, _ in pdg.dims if d.name == "di0")
    overlap = replace(read, phi=(*read.phi[:-1], Slice(di, di + 4)))
    assert plan_block_storage(pdg.with_(edges=(*pdg.edges, overlap)))


def test_off_means_point_store_only(backend: AbstractBackend) -> None:
    e = run(cumsum_program(6), backend, block_store=False)
    assert e.block_plan == {} and e.store.block_tables() == []
    assert e.memory_stats().block_bytes == 0


# -- same values with and without, and as the reference -------------------------------------------
@pytest.mark.parametrize("name", ["cumsum", "batched", "select"])
def test_static_programs_same_values(backend: AbstractBackend, name: str) -> None:
    make = {"cumsum": lambda: cumsum_program(6), "batched": batched_program, "select": select_program}[name]
    prog = make()
    on = run(prog, backend, True, seed=5)
    off = run(make(), backend, False, seed=5)
    assert_same_values(on, off, min_points=10)
    assert_matches_reference(on, reference_evaluate(prog.pdg, backend, seed=5), prog.pdg, min_points=10)
    if name != "select":
        assert on.memory_stats().block_bytes > 0


@pytest.mark.parametrize(
    ("schedule", "window"), [("mc", 2), ("rev", 2), ("nstep", 2), ("nstep", 3), ("split", 3)]
)
def test_dynamic_bound_same_values(backend: AbstractBackend, schedule: str, window: int) -> None:
    """r[t:T], r[0:T] and r[t:min(t + window, T)] over episodes of dynamic lengths, one
    longer than a block (its reads span two blocks)."""
    ep_len = (5, 3, 70, 1, 4)
    prog = episode_program(ep_len, schedule, window=window)
    on = run(prog, backend, True)
    off = run(episode_program(ep_len, schedule, window=window), backend, False)
    assert_same_values(on, off, min_points=150)
    ng = {p: float(on.value(prog.ids["ng"], p)) for p in on.points(prog.ids["ng"])}
    if schedule == "nstep":
        for ep, n in enumerate(ep_len):
            for k in range(n):
                r = [0.5 * (100 * ep + j) for j in range(n)]
                assert ng[(ep, k)] == pytest.approx(sum(r[k : k + window]), rel=1e-6)
    (table,) = on.store.block_tables()
    # one block per episode, more for 70 steps
    assert table.allocations == 4 + 70 // DEFAULT_BLOCK + 1 and not table.demoted
    assert on.memory_stats().block_bytes == (4 + 70 // DEFAULT_BLOCK + 1) * DEFAULT_BLOCK * 4
    prog.calls.clear()
    ref = reference_evaluate(prog.pdg, backend)
    assert_matches_reference(on, ref, prog.pdg, min_points=150)


# -- the table and its accounting -------------------------------------------------------------------
def _table(backend: AbstractBackend, rows: int = 4) -> BlockTable:
    return BlockTable(BlockSpec(0, 0, 1, t, None, rows, 0), backend, "x")


def test_table_reads_writes_and_frees(backend: AbstractBackend) -> None:
    tab = _table(backend)
    st = PointStore(backend.nbytes)
    st.declare(0, 1)
    st.declare_block(0, 0, tab)
    for k in range(6):
        st.put(0, 0, (7, k), backend.from_numpy(np.full((2,), k, np.float32)))
    assert (7, 3) in tab and (7, 6) not in tab and (8, 0) not in tab and (7, -1) not in tab
    assert sorted(st.points(0)) == [(7, k) for k in range(6)]
    np.testing.assert_array_equal(backend.to_numpy(st.get(0, 0, (7, 5))), [5, 5])
    rows = backend.to_numpy(tab.rows((7,), 1, 3, 4))  # one block, padded to 4 rows
    np.testing.assert_array_equal(rows, [[1, 1], [2, 2], [0, 0], [0, 0]])
    rows = backend.to_numpy(tab.rows((7,), 2, 6, 4))  # spans two blocks
    np.testing.assert_array_equal(rows, [[2, 2], [3, 3], [4, 4], [5, 5]])
    with pytest.raises(KeyError) as info:
        tab.rows((7,), 3, 8, 5)
    assert info.value.args[0] == (7, 6)
    s = st.stats()
    assert (s.live_bytes, s.block_bytes, s.live_points) == (2 * 4 * 2 * 4, 2 * 4 * 2 * 4, 6)
    # freeing points keeps a block until its last point goes
    assert st.free(0, (7, 0)) == 0 and st.stats().live_points == 5
    assert [st.free(0, (7, k)) for k in range(1, 6)] == [0, 0, 32, 0, 32]
    s = st.stats()
    assert (s.live_bytes, s.block_bytes, s.live_points, s.peak_bytes) == (0, 0, 0, 64)
    assert tab.num_blocks == 0


def test_rows_layout_matches_stack(backend: AbstractBackend) -> None:
    """Batched rows (batch 3, per-point (2,)) read across blocks: the same array as stacking."""
    tab = BlockTable(BlockSpec(0, 0, 0, t, None, 2, 1), backend, "x")
    vals = [np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * k for k in range(5)]
    for k, v in enumerate(vals):
        tab.put((k,), backend.from_numpy(v))
    got = backend.to_numpy(tab.rows((), 1, 4, 4))
    want = backend.to_numpy(backend.stack_padded([backend.from_numpy(v) for v in vals[1:4]], 1, 4))
    assert got.shape == (3, 4, 2)
    np.testing.assert_array_equal(got, want)
    assert tab.allocations == 3 and tab.bytes == 3 * 2 * 6 * 4


def test_rows_put_at_once_equal_rows_put_one_by_one(backend: AbstractBackend) -> None:
    """A scanned loop's rows (batch 3, per-point (2,), rows after the batch axis, a chunk's
    padding after them) written in one call per block: the same table as point puts, the
    same accounting; points that are not consecutive along the block dim are refused."""
    vals = np.arange(3 * 8 * 2, dtype=np.float32).reshape(3, 8, 2)  # rows 0..6 used, 7 padding
    one, many = (BlockTable(BlockSpec(0, 0, 1, t, None, 4, 1), backend, "x") for _ in range(2))
    for tab in (one, many):  # a row already written in the first block
        tab.put((4, 1), backend.from_numpy(vals[:, 0]))
    cols = np.asarray([(4, k) for k in range(2, 9)], dtype=np.int64)
    for j, (_, k) in enumerate(cols):
        one.put((4, int(k)), backend.from_numpy(vals[:, j]))
    assert many.put_rows(cols, backend.from_numpy(vals), 1) == (2 * 4 * 3 * 2 * 4, 7)
    assert sorted(many) == sorted(one) and many.bytes == one.bytes and many.num_points == one.num_points
    np.testing.assert_array_equal(
        backend.to_numpy(many.rows((4,), 1, 9, 8)), backend.to_numpy(one.rows((4,), 1, 9, 8))
    )
    assert many.put_rows(np.asarray([(4, 10), (4, 12)]), backend.from_numpy(vals[:, :2]), 1) is None
    assert many.put_rows(np.asarray([(4, 10), (5, 11)]), backend.from_numpy(vals[:, :2]), 1) is None


def test_rewriting_a_row_keeps_earlier_reads(backend: AbstractBackend) -> None:
    tab = _table(backend)
    tab.put((0, 0), backend.from_numpy(np.float32(1)))
    tab.put((0, 1), backend.from_numpy(np.float32(2)))
    row, rows = tab[(0, 0)], tab.rows((0,), 0, 2, 2)
    assert tab.put((0, 0), backend.from_numpy(np.float32(5))) == (0, 0)
    assert float(backend.to_numpy(row)) == 1.0
    np.testing.assert_array_equal(backend.to_numpy(rows), [1, 2])
    assert float(backend.to_numpy(tab[(0, 0)])) == 5.0


def test_misfit_value_demotes_to_points(backend: AbstractBackend, caplog) -> None:
    st = PointStore(backend.nbytes)
    st.declare(0, 1)
    tab = _table(backend)
    st.declare_block(0, 0, tab)
    st.put(0, 0, (0, 0), backend.from_numpy(np.ones((2,), np.float32)))
    st.put(0, 0, (0, 1), backend.from_numpy(np.ones((3,), np.float32)))  # another shape
    assert tab.demoted and "point store" in caplog.text
    s = st.stats()
    assert (s.live_bytes, s.live_points, s.block_bytes) == (8 + 12, 2, 0)
    assert tab.rows((0,), 0, 2, 2) is None
    assert backend.to_numpy(tab[(0, 1)]).shape == (3,)
    assert st.free(0, (0, 1)) == 12 and st.stats().live_bytes == 8


# -- the REINFORCE example -------------------------------------------------------------------------
def _reinforce(backend: str, n: int, block_store: bool, iterations: int = 2, **options: Any):
    import sys
    from pathlib import Path

    import timerl as trl

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from example_pdg import reinforce

    got: list[tuple[int, int, float]] = []
    args = reinforce.Args(backend=backend, n=n, iterations=iterations, num_envs=3, seed=2)
    orig = trl.Context.compile

    def compile_with(self, bounds, **kw):
        return orig(
            self, bounds, block_store=block_store, dealloc=False, **{**kw, **options}
        )  # values are read from the store after the run: no frees

    trl.Context.compile = compile_with  # type: ignore[method-assign]
    try:
        ex = reinforce.build(args, lambda v, p: got.append((p["i"], p["b"], float(v))))
    finally:
        trl.Context.compile = orig  # type: ignore[method-assign]
    ex.execute()
    return ex, sorted(got)


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("n", [0, 3])
def test_reinforce_same_with_and_without(backend: str, n: int) -> None:
    """The REINFORCE program (MC returns r[t:T], 3-step r[t:min(t+3, T)], gradient sums over
    0:T): the same episode returns and the same stored values, bit for bit."""
    # Monte-Carlo returns read r[t:T] per t only without suffix_scan (with it, one suffix sum
    # reads r[0:T] once per episode: no overlapping slices, no block table)
    opts = {"suffix_scan": False}
    on, r_on = _reinforce(backend, n, True, **opts)
    off, r_off = _reinforce(backend, n, False, **opts)
    assert len(r_on) == 6 and r_on == r_off
    if n == 0:
        scanned, r_scanned = _reinforce(backend, n, True)
        assert r_scanned == r_on and not scanned._interp.store.block_tables()
    # only the rewards: read by overlapping slices at every t; the gradient and activation
    # sums over 0:T read each point once per iteration and stay in the point store
    (table,) = on._interp.store.block_tables()
    assert table.label == "'CartPole-v1.step'" and table.spec.oid == 1 and not table.demoted
    assert table.spec.rows == (32 if n == 0 else 8)
    assert_same_values(on._interp, off._interp, min_points=50)


def test_jax_host_buffers_same_values() -> None:
    """JAX block buffers kept in host NumPy arrays (``host_blocks=True``) give the same values."""
    from timerl.backends.jax_backend import JaxBackend

    ep_len = (5, 40, 3)
    on = run(episode_program(ep_len, "nstep", window=3), JaxBackend(host_blocks=True), True)
    off = run(episode_program(ep_len, "nstep", window=3), JaxBackend(), False)
    assert_same_values(on, off, min_points=80)
    (table,) = on.store.block_tables()
    assert table.allocations == 4 and isinstance(next(iter(table._blocks.values())).buf, np.ndarray)

"""Incrementalization (``timerl/pdg/passes/incrementalize.py``, TimeRL Alg. 3): reductions
over more than ``CompileOptions(incrementalize=bytes)`` run in blocks along a new dim. The
same programs with and without the pass, compiled on both backends and in the reference
evaluator, give the same values up to float summation order; the fuzz profile
(``tests/fuzz``) runs every random program with a tiny threshold too."""

from __future__ import annotations

import math

import numpy as np
import pytest
from random_programs import build, outputs

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.errors import TimeRLError
from timerl.pdg.ops import OpKind
from timerl.pdg.passes.incrementalize import incrementalize
from timerl.runtime.reference import reference_evaluate
from timerl.symbolic import Slice, free_symbols

N = 997  # rows of the big per-point tensors (prime: no block size divides it)
TOL = 1e-4  # sums of ~1000 float32 values in another order


def _close(a: list, b: list, tol: float = TOL) -> None:
    assert [(r[0], r[1]) for r in a] == [(r[0], r[1]) for r in b]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x[2], y[2], rtol=tol, atol=tol, err_msg=f"sink {x[0]} at {x[1]}")


def _sink(out: list, tag: str):
    return lambda v, p: out.append((tag, tuple(sorted(p.items())), np.array(v, np.float64)))


def _rows_program() -> tuple[trl.Context, dict, list]:
    """Gradient descent over rows: a (N, 16) input, one tanh layer, the layer's output summed
    over rows (a SUM root), and the weight gradient (a contraction over the rows: a MATMUL
    root) through the backward chain."""
    out: list = []
    rng = np.random.default_rng(0)
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        w = trl.param(rng.normal(0, 0.3, (16, 8)).astype(np.float32), domain=(i,), name="w")
        x = trl.const(rng.normal(0, 1, (N, 16)).astype(np.float32)) + trl.as_tensor(i) * 0.01
        y = (x @ w).tanh()
        y.sum(0).sink(_sink(out, "s"))
        (y * y).sum().backward()
        trl.optim.SGD([w], lr=0.01).step()
        w.sink(_sink(out, "w"))
    return ctx, {I: 3}, out


def _nested_program() -> tuple[trl.Context, dict, list]:
    """Layout ops between the root and the big input (PERMUTE, a softmax and a keepdim sum
    over the other axis, UNSQUEEZE/SQUEEZE, a broadcast mean): the axis is tracked through
    them; a second, small reduction over the same rows (the per-row maximum summed) joins
    the first one's blocks."""
    out: list = []
    rng = np.random.default_rng(1)
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        x = trl.const(rng.normal(0, 1, (N, 8)).astype(np.float32)) * (trl.as_tensor(i) + 1.0)
        z = x.log_softmax(1) - x.mean(0)  # the mean over rows is read whole by every block
        p = z.permute(1, 0)  # (8, N): the axis moves to 1
        q = p.unsqueeze(0).squeeze(0)
        q.sum(1).sink(_sink(out, "cols"))
        r = z.sum(1, keepdim=True) * 0.5  # (N, 1): small, computed from the big z
        r.sum(0).sink(_sink(out, "rows"))
    return ctx, {I: 2}, out


def _steps_program(vectorize_time: bool) -> tuple[trl.Context, dict, list]:
    """Monte-Carlo style: a per-step (64,) value summed over ``0:T`` per iteration (the
    stacked axis of a symbolic slice, read in blocks through the edge)."""
    out: list = []
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        v = trl.const(np.linspace(-1, 1, 64).astype(np.float32))
        x = (v * trl.as_tensor(t) * 0.1 + trl.as_tensor(i)).tanh()
        x[i, 0:T].sum(0).sink(_sink(out, "total"))
    return ctx, {I: 2, T: 37}, out


def _run(make, backend: str, **options) -> list:
    ctx, bounds, out = make()
    ctx.compile(bounds, backend=backend, **options).execute()
    return sorted(out, key=lambda r: (r[0], r[1]))


def _reference(make, backend: str, **options) -> list:
    ctx, bounds, out = make()
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions(**options)), get_backend(backend))
    return sorted(out, key=lambda r: (r[0], r[1]))


def _block_dims(pdg) -> list[tuple[str, int]]:
    return [(d.name, int(pdg.static_bounds[b])) for d, b in pdg.dims if d.name.startswith("di")]


def test_rows_in_blocks_that_do_not_divide_the_axis() -> None:
    """8 KiB over 16-float rows of 4-byte floats and the chain's 8-wide rows: blocks of 42
    rows, 24 of them (the last one 31 rows); the reductions accumulate their block results;
    no node holds all N rows but the constant input."""
    ctx, bounds, _ = _rows_program()
    pdg = build_pdg(ctx, bounds, CompileOptions(incrementalize=8192))
    ((name, count),) = _block_dims(pdg)
    assert count == math.ceil(N / 42) and N % 42 != 0
    di = next(d for d, _ in pdg.dims if d.name == name)
    # the sum over rows and the weight gradient: each accumulated over the blocks by a
    # recurrence (a MERGE over di), whose last value the root copies
    accs = [n for n in pdg if n.op.kind is OpKind.MERGE and di in n.domain]
    assert len(accs) == 2
    last = [e for e in pdg.edges if e.src in {n.id for n in accs} and di not in pdg.nodes[e.sink].domain]
    assert len(last) == 2 and all(pdg.nodes[e.sink].op.kind is OpKind.IDENTITY for e in last)
    assert all(str(e.phi[-1]) == f"DI{name[2:]} - 1" for e in last), [e.phi for e in last]
    for n in pdg:
        shape = n.outputs[0].shape if n.outputs else ()
        if shape and shape[0] == N:
            assert n.op.kind is OpKind.CONST or di in n.domain, n
    slices = [n for n in pdg if n.op.kind is OpKind.SLICE]
    assert slices and all(di in n.domain for n in slices)


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("make", [_rows_program, _nested_program], ids=["rows", "nested"])
def test_same_values_with_and_without_and_in_the_reference_evaluator(backend: str, make) -> None:
    base = _run(make, backend)
    assert base
    for thr in (8192, 3000):
        _close(_run(make, backend, incrementalize=thr), base)
    _close(_reference(make, backend, incrementalize=3000), base)
    _close(_run(make, backend, incrementalize=8192, dealloc=False, fuse=False), base)


def test_nested_chain_shares_one_block_dim() -> None:
    """The permuted sum and the small per-row sum are both tiled along one dim, and the big
    log-softmax and its permutation exist only as block copies."""
    ctx, bounds, _ = _nested_program()
    off = build_pdg(ctx, bounds, CompileOptions())
    ctx, bounds, _ = _nested_program()
    on = build_pdg(ctx, bounds, CompileOptions(incrementalize=8192))
    assert len(_block_dims(on)) == 1
    di = next(d for d, _ in on.dims if d.name.startswith("di"))
    for kind in (OpKind.LOG_SOFTMAX, OpKind.PERMUTE):
        assert any(n.op.kind is kind for n in off)
        assert all(di in n.domain for n in on if n.op.kind is kind), kind
    small = [n for n in on if n.op.kind is OpKind.SUM and n.op.attr("keepdim", False)]
    assert small and all(di in n.domain for n in small)  # the (N, 1) sum runs per block too


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("vectorize_time", [False, True])
def test_sum_over_steps_reads_blocks_of_the_slice(backend: str, vectorize_time: bool) -> None:
    """``x[i, 0:T].sum(0)`` with T = 37 (prime) in blocks of 8 (5 blocks, the last of 5 steps):
    the edge takes ``8 * di : min(8 * di + 8, 37)`` of the per-step points. With ``x``
    vectorized over t (one stored tensor over all steps) there is nothing to tile: the
    graph is left as it is."""
    make = lambda: _steps_program(vectorize_time)  # noqa: E731
    ctx, bounds, _ = make()
    pdg = build_pdg(ctx, bounds, CompileOptions(vectorize_time=vectorize_time, incrementalize=64 * 4 * 8))
    if vectorize_time:
        assert _block_dims(pdg) == []
    else:
        assert _block_dims(pdg) == [("di0", 5)]
        di = next(d for d, _ in pdg.dims if d.name == "di0")
        blocked = [e for e in pdg.edges if di in pdg.nodes[e.sink].domain and e.src not in
                   {n.id for n in pdg if di in n.domain}]  # fmt: skip
        reads = [c for e in blocked for c in e.phi if isinstance(c, Slice)]
        assert any(di in free_symbols(c.start) for c in reads)
    base = _run(make, backend, vectorize_time=vectorize_time)
    _close(_run(make, backend, vectorize_time=vectorize_time, incrementalize=64 * 4 * 8), base)
    _close(_reference(make, backend, vectorize_time=vectorize_time, incrementalize=64 * 4 * 8), base)
    t = np.arange(37)[:, None]
    v = np.linspace(-1, 1, 64)[None]
    for _tag, pt, val in base:
        np.testing.assert_allclose(val, np.tanh(v * t * 0.1 + dict(pt)["i"]).sum(0), rtol=1e-5, atol=1e-5)


def test_a_bad_threshold_names_the_option() -> None:
    ctx, bounds, _ = _rows_program()
    for bad in ("lots", 0, True):
        with pytest.raises(TimeRLError, match="incrementalize="):
            build_pdg(ctx, bounds, CompileOptions(incrementalize=bad))


def test_below_the_threshold_the_graph_is_unchanged() -> None:
    ctx, bounds, _ = _rows_program()
    pdg = build_pdg(ctx, bounds, CompileOptions())
    assert incrementalize(pdg, 10**9) is pdg
    # a block of one row already over the threshold: nothing to gain, unchanged
    assert incrementalize(pdg, 4) is pdg or _block_dims(incrementalize(pdg, 4))


@pytest.mark.parametrize("backend", ["torch", "jax"])
@pytest.mark.parametrize("seed", [3, 4, 7, 8])
def test_random_programs_same_values(backend: str, seed: int) -> None:
    """The pass-differential programs (``random_programs.py``) with a threshold of 8 bytes
    (every reduction over more than two floats is tiled)."""
    batch = seed % 2 == 1
    base = outputs(seed, batch, backend)
    ctx, bounds, _ = build(seed, batch)
    assert _block_dims(build_pdg(ctx, bounds, CompileOptions(incrementalize=8)))
    _close(outputs(seed, batch, backend, incrementalize=8), base, 1e-4)


def _mc_program(steps: int) -> tuple[trl.Context, dict, list]:
    """A (32, 32) per-step value of a recurrence (4 KiB a step) summed over ``0:T``."""
    out: list = []
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        s = trl.empty((32,), domain=(i, t), name="s")
        s[i, 0] = trl.const(np.linspace(-1, 1, 32).astype(np.float32)) + trl.as_tensor(i) * 0.1
        s[i, t + 1] = (s * 0.9 + 0.05).tanh()
        x = (s.unsqueeze(1) * s.unsqueeze(0)).tanh()
        x[i, 0:T].sum(0).sink(_sink(out, "total"))
    return ctx, {I: 2, T: steps}, out


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_blocks_of_steps_are_summed_as_they_come(backend: str) -> None:
    """Monte-Carlo style: without the pass the sum over ``0:T`` keeps all ``T`` per-step
    values live (the store peak grows with T); with blocks of 8 steps accumulated by a
    recurrence, isl runs each block sum right after its last step (schedule coefficients
    above 1) and the frees keep one block and the accumulator: the same peak at T = 40 and
    T = 80, and the same sums."""
    peaks: dict[tuple[int, bool], int] = {}
    for steps in (40, 80):
        sums = {}
        for on in (False, True):
            ctx, bounds, out = _mc_program(steps)
            opts = {"incrementalize": 8 * 4096} if on else {}
            ex = ctx.compile(bounds, backend=backend, vectorize_time=False, **opts)
            ex.execute()
            peaks[(steps, on)] = ex.memory_stats().peak_bytes
            sums[on] = sorted(out, key=lambda r: (r[0], r[1]))
        _close(sums[True], sums[False])
    assert peaks[(80, False)] > peaks[(40, False)] + 30 * 4096  # all steps live
    assert peaks[(80, True)] == peaks[(40, True)] < peaks[(40, False)] / 2


# -- blocks of a batch dim: a rollout vectorized over t, learned from in blocks of steps ----------
F, H = 24, 6


def _rollout_program() -> tuple[trl.Context, dict, list]:
    """Observations of a per-step recurrence over ``(b, i, t)``; learning (vectorized over
    ``t``) is one tanh layer whose weight gradient contracts the rollout's rows (a row
    reshape of the stacked observations, ``contract``) and whose bias gradient sums them."""
    out: list = []
    rng = np.random.default_rng(2)
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, B), (i, I), (t, T)):
        w = trl.param(rng.normal(0, 0.3, (F, H)).astype(np.float32), domain=(i,), name="w")
        c = trl.param(np.zeros(H, np.float32), domain=(i,), name="c")
        o = trl.empty((F,), domain=(b, i, t), name="o")
        o[b, i, 0] = trl.const(rng.normal(0, 1, (3, F)).astype(np.float32))[b] + trl.as_tensor(i) * 0.01
        o[b, i, t + 1] = (o * 0.9).tanh() + 0.05
        y = (o @ w + c).tanh()
        (y * y).sum().backward()
        trl.optim.SGD([w, c], lr=0.01).step()
        w.sink(_sink(out, "w"))
        c.sink(_sink(out, "c"))
    return ctx, {B: 3, I: 2, T: 12}, out


def test_contractions_over_a_vectorized_dim_run_in_blocks_of_it() -> None:
    """With 200 bytes, the weight gradient's contraction over the 12 steps of each env and the
    bias gradient's sum run per block of ``t`` (the rows of one step, here): the chain above
    them (forward layer, its VJP, the row reshapes) is copied with a batch of one block of
    ``t`` and reads the stacked observations ``o[b, i, bs*di : bs*di + bs]``; no row
    reshape of all 12 steps is left."""
    ctx, bounds, _ = _rollout_program()
    pdg = build_pdg(ctx, bounds, CompileOptions(incrementalize=200))
    t = next(d for d, _ in pdg.dims if d.name == "t")
    blocks = dict(_block_dims(pdg))
    di = next(d for d, _ in pdg.dims if d.name in blocks and blocks[d.name] == 12)
    rows = [n for n in pdg if n.op.kind is OpKind.RESHAPE and n.op.attr("contracted_rows", False)]
    assert len(rows) == 2 and all(di in n.domain for n in rows)
    copies = [n for n in pdg if t in n.batch_dims and di in n.domain]
    assert copies and all(n.batch[n.batch_dims.index(t)] == 1 for n in copies)
    reads = [e for e in pdg.edges if e.to_batch is t and di in pdg.nodes[e.sink].domain]
    assert reads and all(isinstance(e.phi[-1], Slice) and di in free_symbols(e.phi[-1].start) for e in reads)
    # the forward layer and its VJP over all steps are gone: only copies over di remain
    assert not [n for n in pdg if t in n.batch_dims and n.op.kind is OpKind.TANH_GRAD and di not in n.domain]


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_blocks_of_a_vectorized_dim_same_values(backend: str) -> None:
    """The same parameters with blocks of one and four steps (and without frees or
    fusion) as without the pass, and as the reference evaluator's."""
    base = _run(_rollout_program, backend)
    assert len(base) == 4
    for thr in (200, 800):
        _close(_run(_rollout_program, backend, incrementalize=thr), base, 1e-5)
    _close(_run(_rollout_program, backend, incrementalize=200, dealloc=False, fuse=False), base, 1e-5)
    _close(_reference(_rollout_program, backend, incrementalize=400), base, 1e-5)


def _image_program() -> tuple[trl.Context, dict, list]:
    """A per-step 'image' (512 floats) reduced to 4 values by a matmul (a value head), and
    the 4 values summed over the episode."""
    out: list = []
    rng = np.random.default_rng(3)
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        o = trl.empty((512,), domain=(i, t), name="img")
        o[i, 0] = trl.const(rng.normal(0, 1, 512).astype(np.float32)) + trl.as_tensor(i)
        o[i, t + 1] = (o * 0.5).tanh()
        v = (o @ trl.const(rng.normal(0, 0.1, (512, 4)).astype(np.float32))).tanh()
        v[i, 0:T].sum(0).sink(_sink(out, "v"))
    return ctx, {I: 2, T: 16}, out


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_reductions_of_large_steps_run_per_step(backend: str) -> None:
    """Vectorized over ``t``, the matmul would read all 16 images stacked (32 KiB) after the
    loop; with ``incrementalize`` below that it runs per step, as each image is made (the
    tanh after it stays vectorized), so no image waits for the end of the episode: the store
    peak drops. Same sums."""
    runs = {}
    for thr in (None, 16384):
        ctx, bounds, out = _image_program()
        # scan_loops=False: JAX would run the pure loop as one lax.scan, whose stacked rows
        # hold every step's image until the loop ends (an env step in the loop, as in PPO,
        # keeps it unscanned)
        ex = ctx.compile(bounds, backend=backend, incrementalize=thr, scan_loops=False)
        ex.execute()
        runs[thr] = (sorted(out, key=lambda r: (r[0], r[1])), ex)
    _close(runs[16384][0], runs[None][0], 1e-5)
    t = next(d for d, _ in runs[None][1].pdg.dims if d.name == "t")
    for thr, (_, ex) in runs.items():
        mm = next(n for n in ex.pdg if n.op.kind is OpKind.MATMUL)
        assert (t in mm.domain) == (thr is not None)
    peak = {thr: ex.memory_stats().peak_bytes for thr, (_, ex) in runs.items()}
    assert peak[None] > 16 * 2048 > 2 * peak[16384]  # all 16 images live / a few


def _floor_div_program() -> tuple[trl.Context, dict, list]:
    """A parameter's gradient through a read at ``t // 2`` (issue 38's class): the gradient
    sums the reads' cotangents per source point with a one-hot mask ``EQ(comp[0:T], s)``,
    vectorized over ``t`` and reading all ``T`` rows of ``comp`` at every point."""
    out: list = []
    ctx = trl.Context(dims=("t",))
    with ctx as ((t, T),):
        w = trl.param(np.float32(0.3), name="w")
        x = trl.const(np.array([0.5, -0.25], np.float32)) * w + trl.as_tensor(t) * 0.1
        y = x[t // 2].tanh()
        (y * y).sum().backward()
        w.grad.sink(_sink(out, "g"))
    return ctx, {T: 4}, out


def test_a_mask_over_all_rows_reads_the_block_of_rows() -> None:
    """The mask's read ``comp[t = 0:T]`` is a stacked axis of each point (the runtime's layout),
    not the sink's batch dim ``t``: its block copies read ``comp[t = di : di + 1]``, one row
    per block, as their per-point shape ``(1,)`` says (``verify_pdg`` inside ``build_pdg``)."""
    ctx, bounds, _ = _floor_div_program()
    pdg = build_pdg(ctx, bounds, CompileOptions(incrementalize=8))
    masks = [n for n in pdg if n.op.kind is OpKind.EQ and n.outputs[0].shape]
    assert masks and all(n.outputs[0].shape == (1,) for n in masks)
    reads = [e for m in masks for e in pdg.data_in_edges(m.id) if e.batch_read]
    assert reads
    for e in reads:
        ((d, comp),) = e.batch_read
        assert isinstance(comp, Slice) and free_symbols(comp.start) and d.name == "t", e


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_a_mask_over_all_rows_same_values(backend: str) -> None:
    base = _run(_floor_div_program, backend)
    assert len(base) == 1
    _close(_run(_floor_div_program, backend, incrementalize=8), base, 1e-6)
    _close(_reference(_floor_div_program, backend, incrementalize=8), base, 1e-6)

"""Buffer donation (``CompileOptions(donate=True)``, ``plan/donate.py``), run end to end.

An SGD-with-momentum program (a parameter ``w`` and a moment ``m`` carried across
iterations, like the Adam moments of PPO): with donation the regions updating them
reuse the buffers of ``w[i]`` and ``m[i]`` (JAX ``donate_argnums``), and every sunk value
is bit for bit the one computed without donation, with and without frees, on both
backends, and equals the reference evaluator's. Random programs of the fuzz generator
give the same values with donation on and off.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import timerl as trl
from timerl.backends import get_backend
from timerl.compile import CompileOptions, build_pdg
from timerl.plan.donate import merge_moves
from timerl.plan.regions import FusedExec
from timerl.runtime.reference import reference_evaluate
from timerl.symbolic import Sym

N = 512  # floats per parameter


def momentum_program(sink: Any, iters: int = 12, keep_updates: bool = False) -> tuple[trl.Context, dict]:
    """``w[i + 1] = w[i] - 0.01 * m[i + 1]``, ``m[i + 1] = 0.9 m[i] + 0.1 g[i]``; sinks
    ``g[i].sum()`` and the last ``w`` (and, with ``keep_updates``, the sum of every moment at the end, so that
    the moments' tensors stay read after their update)."""
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        w = trl.empty((N,), domain=(i,), name="w")
        m = trl.empty((N,), domain=(i,), name="m")
        w[0] = trl.ones((N,))
        m[0] = trl.zeros((N,))
        g = w[i].tanh() * 0.5 + 1.0
        m_new = m[i] * 0.9 + g * 0.1
        m[i + 1] = m_new
        w[i + 1] = w[i] - m[i + 1] * 0.01
        g.sum(0).sink(lambda v, p: sink(("g", p["i"]), v))
        w[I - 1].sink(lambda v, p: sink(("w", -1), v))  # w[i < I - 1]: read by updates only
        if keep_updates:
            m_new[0:I].sum(0).sum(0).sink(lambda v, p: sink(("m", -1), v))
    return ctx, {I: iters}


def _run(backend: str, keep_updates: bool = False, **options: Any) -> tuple[dict, Any]:
    got: dict[Any, float] = {}
    ctx, bounds = momentum_program(
        lambda k, v: got.__setitem__(k, np.asarray(v).tobytes()), keep_updates=keep_updates
    )
    ex = ctx.compile(bounds, backend=backend, **options)
    ex.execute()
    return got, ex


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("keep_updates", [False, True])
def test_donation_keeps_values_bit_for_bit(backend: str, keep_updates: bool) -> None:
    """donate x dealloc on and off: the same bytes sunk."""
    runs = {
        (d, f): _run(backend, keep_updates, donate=d, dealloc=f)[0]
        for d in (False, True)
        for f in (False, True)
    }
    base = runs[(False, True)]
    assert len(base) == 13 + keep_updates
    for k, got in runs.items():
        assert got == base, k


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_donates_the_carried_buffers(backend: str) -> None:
    """Every iteration donates ``m[i]``'s buffer to the region computing ``m[i + 1]`` (12),
    and every iteration after the first a carried buffer to the region computing
    ``w[i + 1]`` (11; its one output takes one); the merges defining ``w[i + 1]`` and
    ``m[i + 1]`` move their sources (isl: one reader point each), so nothing else holds the
    tensors."""
    _, ex = _run(backend, donate=True)
    given, refused, nbytes = ex._interp.donation_stats
    assert (given, refused, nbytes) == (23, 0, 23 * N * 4)
    assert merge_moves(ex.pdg)  # both merges' update branches
    _, off = _run(backend, donate=False)
    assert off._interp.donation_stats == [0, 0, 0]
    # frees off: no free follows the last reader, nothing is donated
    _, nofree = _run(backend, donate=True, dealloc=False)
    assert nofree._interp.donation_stats == [0, 0, 0]


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_donation_refuses_tensors_held_elsewhere(backend: str) -> None:
    """With every update also read at the end (``m_new[0:I]``), the tensor ``m[i + 1]`` is
    held under two points when its region runs: it must not be donated (donating it would
    delete the array the final sum reads)."""
    got, ex = _run(backend, keep_updates=True, donate=True)
    assert got == _run(backend, keep_updates=True, donate=False)[0]
    given, refused, _ = ex._interp.donation_stats
    assert refused >= 10  # m's buffer, each iteration


def test_donation_marks_regions() -> None:
    """The plan marks ``(member, input)`` pairs on regions (FusedExec.donate)."""
    _, ex = _run("jax", donate=True)
    interp = ex._interp
    marked = [k for k in interp._fused if isinstance(k[0], tuple)]  # (members, donate)
    assert marked, "no region was planned with a donated input"
    assert FusedExec.__dataclass_fields__["donate"].default == ()


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_donation_equals_reference_evaluator(backend: str) -> None:
    got, _ = _run(backend, donate=True)
    want: dict[Any, Any] = {}
    ctx, bounds = momentum_program(lambda k, v: want.__setitem__(k, np.array(v, np.float32)))
    reference_evaluate(build_pdg(ctx, bounds, CompileOptions()), get_backend(backend))
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(np.frombuffer(got[k], np.float32), want[k].ravel(), rtol=1e-6)


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fuzz"))


@pytest.mark.parametrize("backend", ["jax", "torch"])
@pytest.mark.parametrize("seed", [0, 3, 7, 11, 14])
def test_random_programs_same_with_and_without_donation(seed: int, backend: str) -> None:
    """Programs of the fuzz generator (parameters trained by SGD among them): the values
    sunk with donation on equal those with it off, bit for bit."""
    from fuzz_programs import generate, render

    w0 = np.array([0.3, -0.2], np.float32)
    prog = generate(seed)
    outs = []
    for donate in (False, True):
        store: dict[str, dict] = defaultdict(dict)
        ctx, bounds = render(prog, w0, store)
        ex = ctx.compile(bounds, backend=backend, donate=donate)
        ex.execute()
        given = ex._interp.donation_stats[0]
        outs.append({k: {p: np.asarray(v).tobytes() for p, v in d.items()} for k, d in store.items()})
    assert outs[0] == outs[1]
    assert given > 0 or seed == 14  # donations happened (seed 14 has no candidate)


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_dynamic_bounds_programs_same_with_and_without_donation(backend: str) -> None:
    """Episodes of a dynamic length (frees waiting for the bound's setter): donation never
    moves a free or takes an input across a ``SET_SYMBOL``; values bit for bit."""
    from test_dealloc import nstep_program

    outs = []
    for donate in (False, True):
        got: dict[Any, bytes] = {}
        ctx, bounds = nstep_program(
            17, 4, lambda v, p, got=got: got.__setitem__((p["i"], p["t"]), np.asarray(v).tobytes())
        )
        ctx.compile(bounds, backend=backend, donate=donate).execute()
        outs.append(got)
    assert outs[0] == outs[1] and len(outs[0]) == 34


def test_torch_run_into_writes_in_place_bit_for_bit() -> None:
    """Torch: the binary elementwise kernels with ``out=`` give the same bits in the donated
    buffer; shapes or dtypes that do not match are declined (None)."""
    import torch

    from timerl.pdg.ops import Op, OpKind

    be = get_backend("torch")
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 5, generator=g), torch.randn(5, generator=g)
    for kind in (OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.MAXIMUM, OpKind.MINIMUM):
        op = Op.make(kind)
        want = be.run(op, [x, y], (), (False, False), {})
        buf = x.clone()
        got = be.run_into(op, [buf, y], (), (False, False), {}, buf)
        assert got is not None and got.data_ptr() == buf.data_ptr()
        assert torch.equal(got, want)
    assert be.run_into(Op.make(OpKind.ADD), [y, y], (), (False, False), {}, x.clone()) is None  # shape
    assert be.run_into(Op.make(OpKind.EXP), [x], (), (False,), {}, x.clone()) is None  # not binary


def _reread_program(sink: Any) -> tuple[trl.Context, dict]:
    """``d = w[i] - 0.01 m_new`` is ``w[i + 1]``, and ``d * 2 + w[i]`` reads ``w[i]`` after
    ``d`` in the same region: ``d`` must not be written into ``w[i]``'s buffer."""
    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        w = trl.empty((N,), domain=(i,), name="w")
        m = trl.empty((N,), domain=(i,), name="m")
        w[0] = trl.ones((N,))
        m[0] = trl.zeros((N,))
        m_new = m[i] * 0.9 + w[i].tanh() * 0.1
        m[i + 1] = m_new
        d = w[i] - m_new * 0.01
        w[i + 1] = d
        (d * 2.0 + w[i]).sum(0).sink(sink)
    return ctx, {I: 6}


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_no_member_overwrites_an_input_read_after_it(backend: str) -> None:
    outs = []
    for donate in (False, True):
        got: dict[int, bytes] = {}
        ctx, bounds = _reread_program(lambda v, p, got=got: got.__setitem__(p["i"], np.asarray(v).tobytes()))
        ctx.compile(bounds, backend=backend, donate=donate).execute()
        outs.append(got)
    assert outs[0] == outs[1] and len(outs[0]) == 6


def test_in_place_members_never_overwrite_a_buffer_read_later() -> None:
    """Torch writes one member's result into the donated input ``x`` (external input 0): the
    last stored binary elementwise member of ``x``'s signature, unless a later member reads
    ``x`` or a view of it (a non-elementwise op of ``x``), or such a view is stored."""
    from timerl.pdg.ir import Node, TensorSpec
    from timerl.pdg.ops import Op, OpKind
    from timerl.runtime.fusion import in_place_members

    def node(k: int, kind: OpKind, shape: tuple[int, ...] = (N,)) -> Node:
        return Node(k, Op.make(kind), (), (TensorSpec(shape, trl.float32),), 2)

    sig = ((), (N,), trl.float32)
    ext, inn = "ext", "int"
    # 0: y = x * c ; 1: z = y - x   (z stored): z may go into x
    nodes = [node(0, OpKind.MUL), node(1, OpKind.SUB)]
    plans = [[(ext, 0), (ext, 1)], [(inn, 0), (ext, 0)]]
    assert in_place_members(nodes, plans, [1], {0: sig}) == {1: 0}
    # a later member reads x: z must not overwrite it
    nodes3 = [*nodes, node(2, OpKind.ADD)]
    plans3 = [*plans, [(inn, 1), (ext, 0)]]
    assert in_place_members(nodes3, plans3, [1, 2], {0: sig}) == {2: 0}
    assert in_place_members(nodes3, plans3, [1], {0: sig}) == {}
    # a view of x (reshape) read after z: z must not overwrite x
    nodes_v = [node(0, OpKind.RESHAPE), node(1, OpKind.SUB), node(2, OpKind.SUM, ())]
    plans_v = [[(ext, 0)], [(ext, 1), (ext, 2)], [(inn, 0)]]
    assert in_place_members(nodes_v, plans_v, [1, 2], {0: sig}) == {}
    # a stored view of x: nothing may overwrite x
    assert in_place_members(nodes_v[:2], plans_v[:2], [0, 1], {0: sig}) == {}
    # signature mismatch, or not stored: nothing
    assert in_place_members(nodes, plans, [1], {0: ((), (N, 2), trl.float32)}) == {}
    assert in_place_members(nodes, plans, [], {0: sig}) == {}


def test_a_donated_buffer_offloaded_again_is_copied_anew() -> None:
    """Torch: ``a`` is offloaded (its host copy is kept for the tensor, which the ``MERGE`` ``m``
    stores too); the region ``y = m * k``, the last reader of ``m``, writes ``y`` into that
    tensor (donation); offloading ``y`` then must copy the tensor's new contents, not reuse
    ``a``'s host copy (``y`` came back as ``a``: fuzz seed 517300046, issue 38)."""
    from helpers_rt import interpret
    from runtime_pdgs import Builder, T, const, ex, free

    from timerl.pdg.ir import TensorSpec
    from timerl.pdg.ops import DType, OpKind
    from timerl.schedule.ast import Fetch, Offload, Seq

    b = Builder()
    v2 = TensorSpec((2,), DType.float32)
    c = b.add(OpKind.CONST, (), (v2,), "c", **const([1.0, 2.0]))
    k = b.add(OpKind.CONST, name="k", **const(3.0))
    a = b.add(OpKind.ADD, (), (v2,), "a")
    m = b.add(OpKind.MERGE, (), (v2,), "m")
    y = b.add(OpKind.MUL, (), (v2,), "y")
    s = b.add(OpKind.ADD, (), (v2,), "s")
    b.read(a, c, ())
    b.read(a, k, ())
    b.read(m, a, ())
    b.read(y, m, ())
    b.read(y, k, ())
    z = b.add(OpKind.NEG, (), (v2,), "z")  # a read of a outside its region: m does not move a
    b.read(s, y, ())
    b.read(s, c, ())
    b.read(z, a, ())
    body = (ex(c), ex(k), ex(a), ex(m), Offload(a, ()), ex(y), free(m), Offload(y, ()), Fetch(y, ()), ex(s))
    body += (Fetch(a, ()), ex(z))
    e = interpret(b.pdg(((Sym("t"), T),), {T: 1}), Seq(body), get_backend("torch"), donate=True)
    e.execute()
    assert e.donation_stats[0] == 1  # y was written into a's (and m's) tensor
    np.testing.assert_array_equal(e.value(s, ()), [13.0, 17.0])  # (c + k) * k + c
    np.testing.assert_array_equal(e.value(z, ()), [-4.0, -5.0])

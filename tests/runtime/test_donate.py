"""Buffer donation (``CompileOptions(donate=True)``, ``schedule/donate.py``), run end to end.

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
from timerl.runtime.reference import reference_evaluate
from timerl.runtime.regions import FusedExec
from timerl.schedule.donate import merge_moves

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


def test_jax_donates_the_carried_buffers() -> None:
    """Every iteration after the first donates a carried buffer to the region computing
    ``w[i + 1]`` (its one output takes one: ``m[i]``'s, whose free comes first); the merge
    defining ``m[i + 1]`` moves its source (isl: one reader point each), so nothing else
    holds the tensor."""
    _, ex = _run("jax", donate=True)
    given, refused, nbytes = ex._interp.donation_stats
    assert (given, refused, nbytes) == (11, 0, 11 * N * 4)
    assert merge_moves(ex.pdg)  # both merges' update branches
    _, off = _run("jax", donate=False)
    assert off._interp.donation_stats == [0, 0, 0]
    # frees off: no free follows the last reader, nothing is donated
    _, nofree = _run("jax", donate=True, dealloc=False)
    assert nofree._interp.donation_stats == [0, 0, 0]


def test_donation_refuses_tensors_held_elsewhere() -> None:
    """With every update also read at the end (``m_new[0:I]``), the tensor ``m[i + 1]`` is
    held under two points when its region runs: it must not be donated (donating it would
    delete the array the final sum reads)."""
    got, ex = _run("jax", keep_updates=True, donate=True)
    assert got == _run("jax", keep_updates=True, donate=False)[0]
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


@pytest.mark.parametrize("seed", [0, 3, 7, 11, 14])
def test_random_programs_same_with_and_without_donation(seed: int) -> None:
    """Programs of the fuzz generator (parameters trained by SGD among them): the values
    sunk with donation on equal those with it off, bit for bit (JAX, where donation acts)."""
    from fuzz_programs import generate, render

    w0 = np.array([0.3, -0.2], np.float32)
    prog = generate(seed)
    outs = []
    for donate in (False, True):
        store: dict[str, dict] = defaultdict(dict)
        ctx, bounds = render(prog, w0, store)
        ctx.compile(bounds, backend="jax", donate=donate).execute()
        outs.append({k: {p: np.asarray(v).tobytes() for p, v in d.items()} for k, d in store.items()})
    assert outs[0] == outs[1]


def test_dynamic_bounds_programs_same_with_and_without_donation() -> None:
    """Episodes of a dynamic length (frees waiting for the bound's setter): donation never
    moves a free or takes an input across a ``SET_SYMBOL``; values bit for bit."""
    from test_dealloc import nstep_program

    outs = []
    for donate in (False, True):
        got: dict[Any, bytes] = {}
        ctx, bounds = nstep_program(
            17, 4, lambda v, p, got=got: got.__setitem__((p["i"], p["t"]), np.asarray(v).tobytes())
        )
        ctx.compile(bounds, backend="jax", donate=donate).execute()
        outs.append(got)
    assert outs[0] == outs[1] and len(outs[0]) == 34

"""The schedule-free reference evaluator on its own: depth, bound discovery, errors."""

from __future__ import annotations

import numpy as np
import pytest
from runtime_pdgs import BOOL, F32, Builder, T, chain_program, episode_program, t

from timerl.backends import AbstractBackend
from timerl.errors import BoundError, RuntimeExecutionError
from timerl.pdg.ops import OpKind
from timerl.runtime.reference import ReferenceEvaluator, reference_evaluate
from timerl.symbolic import Slice


def test_long_recurrence_needs_no_deep_recursion(backend: AbstractBackend) -> None:
    prog = chain_program(500)
    ref = ReferenceEvaluator(prog.pdg, backend)
    ref.demand((prog.ids["y"], (499,)))  # pulls the whole chain from the far end
    assert float(ref.memo[(prog.ids["y"], (499,))][0]) == 505
    assert len(ref.memo) == 2 + 2 * 500


def test_all_points_off_evaluates_only_what_effects_need(backend: AbstractBackend) -> None:
    prog = episode_program((3, 2), "mc")
    out = reference_evaluate(prog.pdg, backend, all_points=False)
    assert [c for c in prog.calls if c[0] == "sink"] == [("sink", 0, 1.5), ("sink", 1, 100.5)]
    assert out[prog.ids["g"]] == {}  # learning is not needed by any sink
    assert set(out[prog.ids["tot"]]) == {(0, (0,)), (0, (1,))}
    full = reference_evaluate(episode_program((3, 2), "mc").pdg, backend)
    assert len(full[prog.ids["g"]]) == 5


def test_bound_discovery_per_enclosing_point(backend: AbstractBackend) -> None:
    prog = episode_program((4, 1, 2), "mc")
    ref = ReferenceEvaluator(prog.pdg, backend)
    assert ref.bound(T, (1,)) == 1  # on demand, before the walk
    out = ref.run()
    assert ref.found[T] == {(0,): 4, (1,): 1, (2,): 2}
    assert set(out[prog.ids["step"]]) == {
        (oid, (i, k)) for oid in range(3) for i, n in enumerate((4, 1, 2)) for k in range(n)
    }
    np.testing.assert_allclose(out[prog.ids["g"]][(0, (2, 0))], 0.5 * 200 + 0.5 * 201)


def test_cycle_is_reported(backend: AbstractBackend) -> None:
    b = Builder()
    x = b.add(OpKind.NEG, (t,), name="x")
    b.read(x, x, (t,))
    with pytest.raises(RuntimeExecutionError, match="cyclic"):
        reference_evaluate(b.pdg(((t, T),), {T: 2}), backend)


def test_done_signal_needing_its_own_bound(backend: AbstractBackend) -> None:
    b = Builder()
    ev = b.add(OpKind.EVAL_SYMBOL, (t,), (BOOL,), "late", expr=t == T - 1, dtype=BOOL.dtype)
    d = b.add(OpKind.SET_SYMBOL, (t,), (), "done", bound=T, dim=t)
    b.read(d, ev, (t,))
    with pytest.raises(BoundError, match="needs the bound T"):
        reference_evaluate(b.pdg(((t, T),), {}, frozenset({T})), backend)


def test_read_outside_domain(backend: AbstractBackend) -> None:
    b = Builder()
    x = b.add(OpKind.EVAL_SYMBOL, (t,), (F32,), "x", expr=t, dtype=F32.dtype)
    y = b.add(OpKind.SUM, (t,), (F32,), "y", dims=(0,), keepdim=False)
    b.read(y, x, (Slice(t, t + 2),))  # reads x[T] at t = T - 1
    with pytest.raises(RuntimeExecutionError, match="'x' is evaluated at \\{'t': 3\\}, outside its domain"):
        reference_evaluate(b.pdg(((t, T),), {T: 3}), backend)

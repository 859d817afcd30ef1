"""Comparison helpers for the runtime tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from timerl.pdg.ir import PDG
from timerl.plan.plan import PlanOptions, Target, make_plan
from timerl.runtime.interpreter import Executor
from timerl.schedule.ast import AstNode


def interpret(pdg: PDG, ast: AstNode, backend: Any, seed: int = 0, **flags: Any) -> Executor:
    """The runtime executor of ``ast`` over ``pdg``: its Plan made with ``flags``
    (:class:`~timerl.plan.plan.PlanOptions`) for ``backend``."""
    return Executor(make_plan(pdg, ast, PlanOptions(**flags), Target.of(backend)), backend, seed=seed)


def assert_matches_reference(ex: Executor, ref: dict, pdg: PDG, min_points: int = 1) -> int:
    """Every value the executor still holds equals the reference's; returns how many were compared."""
    n = 0
    for nid, node in pdg.nodes.items():
        for oid in range(len(node.outputs)):
            for p in ex.points(nid, oid):
                assert (oid, p) in ref[nid], f"reference lacks {node.label} out {oid} at {p}"
                got, want = ex.value(nid, p, oid), ref[nid][(oid, p)]
                assert got.shape == want.shape, (node.label, p, got.shape, want.shape)
                assert got.dtype == want.dtype, (node.label, p, got.dtype, want.dtype)
                np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{node.label} out {oid} at {p}")
                n += 1
    assert n >= min_points
    return n

"""Which nodes a compiled region may hold, and how its members read each other.

A region (:class:`~timerl.plan.regions.FusedExec`) runs *pure* nodes at one point as one
compiled function: stateless ops whose attributes hold no symbols. Not fusable: ``CONST``,
``MERGE`` (branch choice per point), ``EVAL_SYMBOL``, ``SET_SYMBOL``, UDFs, sinks, RNG ops
(seeded per point), and ops with symbolic attributes (their kernels need the point's
symbol values). Only the outputs read outside the region are stored
(:func:`stored_members`); the runtime compiles regions (``runtime/fusion.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import OpKind
from timerl.plan.layout import InputLayout, input_layout, pads_to_bucket
from timerl.symbolic import TRUE, Expr, Slice, free_symbols

_NOT_FUSABLE = frozenset(
    {
        OpKind.CONST,  # converted once and cached by the backend, outside any trace
        OpKind.MERGE,
        OpKind.EVAL_SYMBOL,
        OpKind.SET_SYMBOL,
        OpKind.UDF,
        OpKind.SINK,
        OpKind.RAND_UNIFORM,
        OpKind.RAND_NORMAL,
    }
)


def _symbolic(value: Any) -> bool:
    if isinstance(value, (Expr, Slice)):
        return bool(free_symbols(value))
    if isinstance(value, (tuple, list)):
        return any(_symbolic(v) for v in value)
    return False


def fusable(node: Node) -> bool:
    """Whether ``node`` may run inside a compiled region."""
    if node.op.kind in _NOT_FUSABLE or len(node.outputs) != 1:
        return False
    return not any(_symbolic(v) for _, v in node.op.attrs)


def static_signature(n: Node) -> tuple[object, ...] | None:
    """``(batch, shape, dtype)`` of a node's only output when its shape is static, else None
    (a donated buffer fits an output of the same signature)."""
    if len(n.outputs) != 1:
        return None
    spec = n.outputs[0]
    if not all(isinstance(d, int) for d in spec.shape):
        return None
    return (tuple(n.batch), tuple(spec.shape), spec.dtype)


def internal_read(e: Edge, pdg: PDG) -> InputLayout | None:
    """How a region member reads another member inside the compiled function, or None when
    it must gather that input from the store. A read at the member's own point qualifies
    (identity indices, no condition or selection), also through batch dims when the
    layout's steps do not depend on the point (``batch[t=0:T]`` of a vectorized member,
    ``T`` static: the whole rollout, narrowed and moved inside the function; ``to_batch``
    at the source's own point, a linear scan's ``T`` rows becoming the reader's batch dim
    ``t``); a read that stacks the source's points (a slice in ``phi``), pads them to a
    bucket, or depends on the point does not."""
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    if (
        e.order_only
        or e.select is not None
        or e.cond is not TRUE
        or (e.to_batch is not None and pads_to_bucket(sink, e))
        or not len(e.phi) == len(src.domain) == len(sink.domain)
        or not all(c is d for c, d in zip(e.phi, src.domain, strict=True))
    ):
        return None
    static = pdg.static_bounds.keys()
    if any(free_symbols(c) - static for _, c in e.batch_read):
        return None
    try:
        return input_layout(src, sink, e)
    except ValueError:
        return None


def stored_members(nodes: Sequence[Node], pdg: PDG) -> list[int]:
    """Positions of the members whose output must be stored: read by a node outside the
    region, or inside it other than through :func:`internal_read`, or by no edge at all
    (kept for :meth:`Executor.value`, as the unfused interpreter keeps it)."""
    inside = {n.id for n in nodes}
    keep = []
    for k, n in enumerate(nodes):
        outs = [e for e in pdg.out_edges(n.id) if not e.order_only]
        if not outs or any(e.sink not in inside or internal_read(e, pdg) is None for e in outs):
            keep.append(k)
    return keep

"""``verify_pdg``: structural invariants of a PDG, checked after every pass.

Invariants: every edge names existing nodes; a data edge's ``iid`` is within the
sink's inputs and its ``oid`` within the source's outputs; ``phi`` has one component
per source-domain dim; ``phi``, ``cond`` and ``select`` use only the sink's dims and
bound symbols (``select`` may also use ``SLICE_VAR``); every non-MERGE node has each
input exactly once; node domains use context dims in context order, and per-point shapes
only those dims (and bounds); an elementwise op's inputs, with the per-point shapes their
edges deliver, broadcast to its output's shape (:func:`read_shape`; a pass that re-points
an edge at a value of another shape breaks it); the rows an edge makes a batch axis are as
many as that axis has.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from timerl.errors import PDGError
from timerl.pdg.ir import PDG, SLICE_VAR, Edge, ShapeDim
from timerl.pdg.ops import ELEMENTWISE_OPS, OpKind
from timerl.symbolic import Const, Slice, evaluate, free_symbols
from timerl.symbolic.simplify import simplify


def _fail(pdg: PDG, e: Edge | None, msg: str) -> None:
    ctx = ""
    if e is not None:
        ctx = f"\n  edge: {e!r}\n  sink: {pdg.nodes.get(e.sink)!r}\n  src:  {pdg.nodes.get(e.src)!r}"
    raise PDGError(f"invalid PDG: {msg}{ctx}")


def _size(pdg: PDG, x: ShapeDim) -> int | None:
    """A per-point size as an int (static bounds substituted), None when it varies
    (``T - t``, a dynamic ``T``)."""
    if isinstance(x, int):
        return x
    if free_symbols(x) <= set(pdg.static_bounds):
        return int(evaluate(x, dict(pdg.static_bounds)))
    x = simplify(x)
    return x.value if isinstance(x, Const) else None


def read_shape(pdg: PDG, e: Edge) -> tuple[int, ...] | None:
    """The per-point shape data edge ``e`` delivers to its sink (the runtime's layout,
    ``timerl/runtime/layout.py``): the source's batch dims the sink lacks and the edge does
    not index (stacked in front), those it reads a slice of, the slices of ``phi`` but the ``to_batch``
    one, then the source's per-point shape (its leading dim picked by ``select``, or made
    the ``to_batch`` dim when ``phi`` has no slice: the rows of a lifted scan). None
    when a size is symbolic or a batch axis is padded to a dynamic bound's bucket."""
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    if len(src.batch_dims) != len(src.batch):
        return None
    size: dict[object, ShapeDim] = dict(zip(src.batch_dims, src.batch, strict=True))
    cur = list(src.batch_dims)
    narrowed: list[ShapeDim] = []  # a slice of a batch axis: a stacked per-point dim of every reader
    for d, comp in e.batch_read:
        if d not in cur:
            return None
        cur.remove(d)
        if isinstance(comp, Slice):
            narrowed.append(comp.stop - comp.start)
    dims: list[ShapeDim] = [size[d] for d in cur if d not in sink.batch_dims] + narrowed
    slices = [c for c in e.phi if isinstance(c, Slice)]
    own = tuple(src.outputs[e.oid].shape)
    if e.to_batch is not None and slices:
        slices = slices[1:]
    elif e.rows_to_batch:  # rows of a value without the dim (a lifted scan's) are its batch
        own = own[1:]
    dims += [c.stop - c.start for c in slices]
    dims += own[1:] if e.select is not None else own
    out = [_size(pdg, x) for x in dims]
    return None if any(x is None for x in out) else tuple(x for x in out if x is not None)


def _verify_rows_to_batch(pdg: PDG) -> None:
    """An edge that makes the rows of its source the sink's batch axis (``to_batch`` with no
    slice in ``phi``) reads exactly as many rows as that axis has."""
    for e in pdg.edges:
        if not e.rows_to_batch or e.order_only:
            continue
        src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
        shape = src.outputs[e.oid].shape
        if e.to_batch not in sink.batch_dims or not shape or len(sink.batch) != len(sink.batch_dims):
            continue
        rows, size = shape[0], sink.batch[sink.batch_dims.index(e.to_batch)]
        if isinstance(rows, int) and isinstance(size, int) and rows != size:
            _fail(pdg, e, f"its {rows} rows become the batch axis {e.to_batch} of {size} rows")


def verify_shapes(pdg: PDG) -> None:
    """Every elementwise op's inputs, as read, broadcast to its output's per-point shape;
    rows read as a batch axis are as many as it has."""
    _verify_rows_to_batch(pdg)
    for n in pdg:
        if n.op.kind not in ELEMENTWISE_OPS or len(n.outputs) != 1:
            continue
        want = tuple(_size(pdg, x) for x in n.outputs[0].shape)
        if any(x is None for x in want):
            continue
        ins = pdg.data_in_edges(n.id)
        shapes = [read_shape(pdg, e) for e in ins]
        if any(s is None for s in shapes):
            continue
        try:
            got = tuple(np.broadcast_shapes(*shapes)) if shapes else ()
        except ValueError:
            got = None
        if got != want:
            reads = ", ".join(f"{pdg.nodes[e.src].label} as {s}" for e, s in zip(ins, shapes, strict=True))
            _fail(pdg, None, f"{n!r} has per-point shape {want}, but its inputs ({reads}) give {got}")


def sink_shapes(pdg: PDG) -> dict[int, tuple[tuple[int, ...] | None, ...]]:
    """The per-point shape each ``SINK`` node receives on each input (:func:`read_shape`)."""
    return {
        n.id: tuple(read_shape(pdg, e) for e in pdg.data_in_edges(n.id))
        for n in pdg
        if n.op.kind is OpKind.SINK
    }


def verify_sink_shapes(
    pdg: PDG, before: Mapping[int, tuple[tuple[int, ...] | None, ...]], after: str
) -> None:
    """Every sink of ``before`` (:func:`sink_shapes` of the PDG a pass got) is still there
    and receives the same per-point shapes from the pass's result."""
    now = sink_shapes(pdg)
    for nid, shapes in before.items():
        if nid not in now:
            raise PDGError(f"invalid PDG after {after}: sink %{nid} was removed")
        for k, (a, b) in enumerate(zip(shapes, now[nid], strict=True)):
            if a is not None and b is not None and a != b:
                raise PDGError(
                    f"invalid PDG after {after}: {pdg.nodes[nid]!r} received per-point shape {a} on input "
                    f"{k} before it and {b} after it"
                )


def verify_pdg(pdg: PDG) -> None:
    order = [s for s, _ in pdg.dims]
    bounds = {b for _, b in pdg.dims}
    for n in pdg:
        pos = [order.index(s) for s in n.domain if s in order]
        if len(pos) != len(n.domain) or pos != sorted(pos):
            _fail(pdg, None, f"node {n!r} has a domain not in context order")
        for spec in n.outputs:
            bad = sorted(
                {s.name for x in spec.shape if not isinstance(x, int) for s in free_symbols(x)}
                - {s.name for s in (*n.domain, *n.batch_dims, *bounds)}
            )
            if bad:
                _fail(pdg, None, f"node {n!r} has a per-point shape that uses {bad}, not dims of its domain")
    seen: dict[tuple[int, int], int] = {}
    for e in pdg.edges:
        if e.sink not in pdg.nodes or e.src not in pdg.nodes:
            _fail(pdg, e, "edge names a missing node")
        sink, src = pdg.nodes[e.sink], pdg.nodes[e.src]
        if len(e.phi) != len(src.domain):
            _fail(pdg, e, f"phi has {len(e.phi)} components for a source with {len(src.domain)} dims")
        allowed = set(sink.domain) | bounds
        for c in (*e.phi, e.cond):
            bad = [s for s in free_symbols(c) if s not in allowed]
            if bad:
                _fail(pdg, e, f"index uses {bad}, which are not dims of the sink")
        if e.select is not None:
            bad = [s for s in free_symbols(e.select) if s not in allowed and s is not SLICE_VAR]
            if bad:
                _fail(pdg, e, f"select uses unknown symbols {bad}")
        if e.order_only:
            continue
        if not 0 <= e.iid < sink.num_inputs:
            _fail(pdg, e, f"iid {e.iid} out of range ({sink.num_inputs} inputs)")
        if not 0 <= e.oid < len(src.outputs):
            _fail(pdg, e, f"oid {e.oid} out of range ({len(src.outputs)} outputs)")
        seen[(e.sink, e.iid)] = seen.get((e.sink, e.iid), 0) + 1
    for n in pdg:
        for k in range(n.num_inputs):
            if seen.get((n.id, k), 0) != 1:
                _fail(pdg, None, f"input {k} of {n!r} has {seen.get((n.id, k), 0)} edges (want 1)")
        if n.op.kind is OpKind.MERGE and n.num_inputs == 0:
            raise PDGError(
                f"{n.label} was created with trl.empty/like but never defined: add branching "
                "definitions such as x[0] = ... and x[t + 1] = ..."
            )
    verify_shapes(pdg)

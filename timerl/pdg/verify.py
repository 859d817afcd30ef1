"""``verify_pdg``: structural invariants of a PDG, checked after every pass.

Invariants: every edge names existing nodes; a data edge's ``iid`` is within the
sink's inputs and its ``oid`` within the source's outputs; ``phi`` has one component
per source-domain dim; ``phi``, ``cond`` and ``select`` use only the sink's dims and
bound symbols (``select`` may also use ``SLICE_VAR``); every non-MERGE node has each
input exactly once; node domains use context dims in context order.
"""

from __future__ import annotations

from timerl.errors import PDGError
from timerl.pdg.ir import PDG, SLICE_VAR, Edge
from timerl.pdg.ops import OpKind
from timerl.symbolic import free_symbols


def _fail(pdg: PDG, e: Edge | None, msg: str) -> None:
    ctx = ""
    if e is not None:
        ctx = f"\n  edge: {e!r}\n  sink: {pdg.nodes.get(e.sink)!r}\n  src:  {pdg.nodes.get(e.src)!r}"
    raise PDGError(f"invalid PDG: {msg}{ctx}")


def verify_pdg(pdg: PDG) -> None:
    order = [s for s, _ in pdg.dims]
    bounds = {b for _, b in pdg.dims}
    for n in pdg:
        pos = [order.index(s) for s in n.domain if s in order]
        if len(pos) != len(n.domain) or pos != sorted(pos):
            _fail(pdg, None, f"node {n!r} has a domain not in context order")
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

"""Fused execution of pure nodes at one point (TimeRL §5.4 dataflow regions).

The scheduler clusters nodes of one domain into a statement; the AST then runs the
members one after the other at the same point. :mod:`~timerl.runtime.regions` groups the
*pure* statements at one point (stateless ops whose attributes hold no symbols) into
regions, reordering them where dependences allow; a region becomes one function of the inputs it reads
from outside, compiled once by the backend (``jax.jit``; Torch runs it eagerly unless
built with ``use_compile``, which still saves the per-node bookkeeping: measured 1.75x
on the PPO example with eager Torch). Only the outputs read outside the region are returned
and stored (:func:`stored_members`): a member read only by later members at the same point
stays inside the compiled function, so XLA fuses it away instead of writing it to memory.

Not fused: ``CONST``, ``MERGE`` (branch choice per point), ``EVAL_SYMBOL``, ``SET_SYMBOL``, UDFs,
sinks, RNG ops (seeded per point), and ops with symbolic attributes (their kernels need
the point's symbol values).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from timerl.pdg.ir import PDG, Edge, Node
from timerl.pdg.ops import OpKind
from timerl.runtime.layout import InputLayout, input_layout
from timerl.symbolic import TRUE, Expr, Slice, free_symbols

if TYPE_CHECKING:
    from timerl.runtime.interpreter import Executor

log = logging.getLogger(__name__)

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


def internal_read(e: Edge, pdg: PDG) -> InputLayout | None:
    """How a region member reads another member inside the compiled function, or None when
    it must gather that input from the store. A read at the member's own point qualifies
    (identity indices, no condition or selection), also through batch dims when the
    layout's steps do not depend on the point (``batch[t=0:T]`` of a vectorized member,
    ``T`` static: the whole rollout, narrowed and moved inside the function); a read that
    stacks the source's points (``to_batch``) or depends on the point does not."""
    src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
    if (
        e.order_only
        or e.select is not None
        or e.cond is not TRUE
        or e.to_batch is not None
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


def make_fused_thunk(
    ex: Executor, nodes: Sequence[Node], compiled_cache: dict[tuple[int, ...], Callable[..., Any]]
) -> Callable[[tuple[int, ...]], None]:
    """One thunk running ``nodes`` (same domain, pure, in order) at a point.

    The compiled region is kept in ``compiled_cache`` (it does not depend on the store),
    so a new run of the program reuses the backend's compiled code.
    """
    pdg, be, store = ex.pdg, ex.backend, ex.store
    inside = {n.id: k for k, n in enumerate(nodes)}
    point_env, enter = ex._point_env_fns(nodes[0])
    static = dict(ex._static)
    # Per member, each input is ("ext", k): the k-th gathered external input, or
    # ("int", j): output of member j at the same point (its layout applied when tracing).
    plans: list[list[tuple[str, int]]] = []
    layouts: dict[tuple[int, int], InputLayout] = {}
    gathers: list[Callable[[Any], Any]] = []
    flags: list[tuple[bool, ...]] = []
    for n in nodes:
        plan = []
        fl = []
        edges = pdg.data_in_edges(n.id)
        for e in edges:
            lay = internal_read(e, pdg) if e.src in inside and inside[e.src] < inside[n.id] else None
            if lay is not None:
                if lay.steps:
                    layouts[(len(plans), len(plan))] = lay
                plan.append(("int", inside[e.src]))
                fl.append(lay.batched)
            else:
                plan.append(("ext", len(gathers)))
                g, batched = ex._make_input(n, e)
                gathers.append(g)
                fl.append(batched)
        plans.append(plan)
        flags.append(tuple(fl))
    specs = [(n.op, tuple(n.batch)) for n in nodes]
    keep = stored_members(nodes, pdg)

    def region(*ext: Any) -> tuple[Any, ...]:
        outs: list[Any] = []
        for m, ((op, batch), plan, fl) in enumerate(zip(specs, plans, flags, strict=True)):
            ins = []
            for j, (kind, k) in enumerate(plan):
                if kind == "ext":
                    ins.append(ext[k])
                    continue
                lay = layouts.get((m, j))
                ins.append(outs[k] if lay is None else lay.apply(outs[k], static, be))
            outs.append(be.run(op, ins, batch, fl, static))
        return tuple(outs[k] for k in keep)

    ids = [n.id for n in nodes]
    kept_ids = [ids[k] for k in keep]
    compiled = compiled_cache.get(tuple(ids))
    if compiled is None:
        compiled = compiled_cache[tuple(ids)] = be.compile(region)
    fallback: list[Callable[[tuple[int, ...]], None]] = []

    def thunk(point: tuple[int, ...]) -> None:
        ex.exec_count += len(ids)
        if enter is not None:
            enter(point)
        if fallback:
            for th in fallback:
                th(point)
            return
        v = point_env(point)
        ext = [g(v) for g in gathers]
        try:
            outs = compiled(*ext)
        except Exception as exc:  # rerun unfused for an error naming the failing node
            labels = ", ".join(n.label for n in nodes)
            log.warning(
                "fused region [%s] failed to compile or run (%s: %s); running its %d ops one by one "
                "(slower) at %s",
                labels,
                type(exc).__name__,
                exc,
                len(ids),
                point,
            )
            fallback.extend(ex._make_thunk(n) for n in nodes)
            ex.exec_count -= len(ids)
            for th in fallback:
                th(point)
            return
        for nid, out in zip(kept_ids, outs, strict=True):
            store.put(nid, 0, point, out)

    return thunk

"""Fused execution of pure nodes at one point (TimeRL §5.4 dataflow regions).

The scheduler clusters nodes of one domain into a statement; the AST then runs the
members one after the other at the same point. :mod:`~timerl.plan.regions` groups the
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
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from timerl.backends.base import AbstractBackend
from timerl.pdg.ir import Edge, Node
from timerl.pdg.ops import Op, OpKind
from timerl.pdg.sizes import bucket, resolve_batch
from timerl.plan.fusable import internal_read, static_signature, stored_members
from timerl.plan.layout import InputLayout, input_layout
from timerl.symbolic import TRUE, Slice, Sym

if TYPE_CHECKING:
    from timerl.runtime.interpreter import Executor

log = logging.getLogger(__name__)

COPY_TO_DONATE = 1 << 22
"""Bytes of donatable inputs held elsewhere up to which a region donates copies of them rather
than run (and, on JAX, compile) a variant that donates fewer: a compilation of PPO's learner
region took 1.3-1.5 s for the one iteration whose parameters the initialiser still held."""


def hinted_ops(
    nodes: Sequence[Node],
    plans: Sequence[Sequence[tuple[str, int]]],
    layouts: Mapping[tuple[int, int], InputLayout],
) -> list[Op]:
    """The members' ops, a ``MATMUL`` whose left operand is a ``PERMUTE(dims=(1, 0))`` member of
    the same region, read as it is, marked ``lhs_transposed=True`` (``contract``'s ``X^T @ Y``:
    the backend may then contract ``X``'s rows without transposing it, ``base.matmul``)."""
    ops = []
    for m, n in enumerate(nodes):
        op = n.op
        if op.kind is OpKind.MATMUL and plans[m] and plans[m][0][0] == "int" and (m, 0) not in layouts:
            src = nodes[plans[m][0][1]].op
            if src.kind is OpKind.PERMUTE and tuple(src.attr("dims")) == (1, 0):
                op = Op.make(OpKind.MATMUL, **dict(op.attrs), lhs_transposed=True)
        ops.append(op)
    return ops


def make_fused_thunk(
    ex: Executor,
    nodes: Sequence[Node],
    compiled_cache: dict[Any, Callable[..., Any]],
    donate: Sequence[tuple[int, int]] = (),
) -> Callable[[tuple[int, ...]], None]:
    """One thunk running ``nodes`` (same domain, pure, in order) at a point.

    The compiled region is kept in ``compiled_cache`` (it does not depend on the store),
    so a new run of the program reuses the backend's compiled code.

    ``donate``: ``(member, input id)`` pairs whose input the region is the last reader of
    (:mod:`timerl.plan.donate`). Such an input, when read at one point of a dict table
    without layout steps, is taken out of the store before the region runs and, when
    nothing else references the tensor, donated to the compiled function (``donate`` of
    :meth:`~timerl.backends.base.AbstractBackend.compile`).
    """
    pdg, be, store = ex.pdg, ex.backend, ex.store
    # batch axes padded to bucket(T) (dynamic T, vectorize_partial): one compiled function
    # per combination of buckets; such regions donate nothing (shapes vary per episode)
    padded = sorted({x for n in nodes for x in n.batch if isinstance(x, Sym)}, key=str)
    if padded:
        donate = ()
    inside = {n.id: k for k, n in enumerate(nodes)}
    point_env, enter = ex._point_env_fns(nodes[0])
    static = dict(ex._static)
    # Per member, each input is ("ext", k): the k-th gathered external input, or
    # ("int", j): output of member j at the same point (its layout applied when tracing).
    plans: list[list[tuple[str, int]]] = []
    layouts: dict[tuple[int, int], InputLayout] = {}
    gathers: list[Callable[[Any], Any]] = []
    wanted = set(donate)
    donated: list[int] = []  # positions of the taken (donatable) external inputs
    plain: dict[int, Callable[[Any], Any]] = {}  # their gathers without the take
    donors: dict[int, Edge] = {}  # their edges
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
                if (n.id, e.iid) in wanted:
                    t = _take_gather(ex, n, e)
                    if t is not None:
                        plain[len(gathers)] = g
                        donors[len(gathers)] = e
                        g = t
                        donated.append(len(gathers))
                gathers.append(g)
                fl.append(batched)
        plans.append(plan)
        flags.append(tuple(fl))
    specs = [(op, tuple(n.batch)) for op, n in zip(hinted_ops(nodes, plans, layouts), nodes, strict=True)]
    keep = stored_members(nodes, pdg)
    into: dict[int, int] = {}  # member -> the donated input it writes its result into (Torch)
    if donated and type(be).run_into is not AbstractBackend.run_into:
        into = in_place_members(
            nodes, plans, keep, {k: static_signature(pdg.nodes[donors[k].src]) for k in donated}
        )
        for k in donated:
            if k not in into.values():  # no member can write into it: read it as usual
                gathers[k] = plain[k]
        donated = sorted(into.values())

    def make_region(
        specs: list[tuple[Any, tuple[Any, ...]]], static: dict[Sym, int]
    ) -> Callable[..., tuple[Any, ...]]:
        # Per member: its kernel bound once (``prepare``, on the first call: a padded
        # region's batch is symbolic until its buckets are known) and its inputs as
        # (external?, position, layout) triples.
        steps = [
            [(kind == "ext", k, layouts.get((m, j))) for j, (kind, k) in enumerate(plan)]
            for m, plan in enumerate(plans)
        ]
        calls: list[Callable[[Sequence[Any]], Any]] = []

        def region(*ext: Any, _into: dict[int, int] | None = None) -> tuple[Any, ...]:
            if not calls:
                calls.extend(
                    be.prepare(op, batch, fl, static) for (op, batch), fl in zip(specs, flags, strict=True)
                )
            outs: list[Any] = []
            for m, step in enumerate(steps):
                ins = [
                    ext[k] if is_ext else (outs[k] if lay is None else lay.apply(outs[k], static, be))
                    for is_ext, k, lay in step
                ]
                out = None
                if _into and m in _into:
                    op, batch = specs[m]
                    out = be.run_into(op, ins, batch, flags[m], static, ext[_into[m]])
                outs.append(calls[m](ins) if out is None else out)
            return tuple(outs[k] for k in keep)

        return region

    region = make_region(specs, static)
    ids = [n.id for n in nodes]
    kept_ids = [ids[k] for k in keep]
    compiled = compiled_cache.get(tuple(ids))
    if compiled is None and not padded:
        compiled = compiled_cache[tuple(ids)] = be.compile(region)

    def per_bucket(v: Mapping[Sym, int]) -> Callable[..., Any]:
        """The region compiled for the buckets of this episode's dynamic bounds."""
        bk = tuple(bucket(v[b]) for b in padded)
        key = (tuple(ids), "buckets", bk)
        fn = compiled_cache.get(key)
        if fn is None:
            env = {**static, **dict(zip(padded, bk, strict=True))}  # bucket(bucket(T)) = bucket(T)
            fn = compiled_cache[key] = be.compile(
                make_region([(op, resolve_batch(b, env)) for op, b in specs], env)
            )
        return fn

    dpos = tuple(donated)

    def giving(ok: tuple[int, ...]) -> Callable[..., Any]:
        """The region donating the inputs at positions ``ok`` (a subset of ``dpos``)."""
        key = (tuple(ids), ok)
        fn = compiled_cache.get(key)
        if fn is None:
            if into:  # Torch: the members writing into the inputs that are donated this time
                sub = {m: k for m, k in into.items() if k in ok}

                def fn_into(*ext: Any) -> tuple[Any, ...]:
                    return region(*ext, _into=sub)

                fn = compiled_cache[key] = be.compile(fn_into, ok)
            else:
                fn = compiled_cache[key] = be.compile(region, ok)
        return fn

    fallback: list[Callable[[tuple[int, ...]], None]] = []
    unstored = [ids[k] for k in range(len(ids)) if k not in set(keep)]

    def free_unstored(point: tuple[int, ...]) -> None:
        """After the members ran one by one: free what the region would not have stored
        (the Plan has no frees of them, ``plan/unstored.py``)."""
        for nid in unstored:
            ex.store.free_points(nid, (point,))

    refcount, nbytes = sys.getrefcount, be.nbytes
    stats = ex.donation_stats
    called: set[tuple[int, ...]] = set()  # the donation variants run so far

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
        fn = per_bucket(v) if padded else compiled
        if dpos:
            # donate only tensors nothing else holds (2: the list and getrefcount's argument;
            # a Torch view holds its base, and a view itself is not donated)
            ok = tuple(k for k in dpos if refcount(ext[k]) == 2 and getattr(ext[k], "_base", None) is None)
            held = [k for k in dpos if k not in ok]
            copied: list[int] = []
            if held and ok not in called and not into:
                # a variant never run (the first iteration's inputs held by the initialiser,
                # say): donate copies of the held inputs instead of compiling one more variant
                if sum(nbytes(ext[k]) for k in held) <= COPY_TO_DONATE:
                    for k in held:
                        ext[k] = be.block_copy(ext[k])
                    copied, ok = held, dpos
            called.add(ok)
            if ok:
                for k in ok:  # its contents change: a host copy of them is no longer its copy
                    store.forget_host_copy(ext[k])
                fn = giving(ok)
                stats[0] += len(ok) - len(copied)  # the held inputs count as not donated
                stats[2] += sum(nbytes(ext[k]) for k in ok if k not in copied)
            if held:
                stats[1] += len(held)
                if log.isEnabledFor(logging.DEBUG):
                    srcs = [gathers[k].edge.src for k in held]  # type: ignore[attr-defined]
                    how = "donating copies of" if copied else "not donating"
                    log.debug("region [%s] at %s: %s %s (held elsewhere)", ids, point, how, srcs)
        try:
            outs = fn(*ext)
        except Exception as exc:  # rerun unfused for an error naming the failing node
            for k in dpos:  # put the taken inputs back for the unfused run
                e = getattr(gathers[k], "edge", None)
                x = ext[k]
                if e is not None and not getattr(x, "is_deleted", lambda: False)():
                    store.put(e.src, e.oid, ex._node_expr(e.phi, pdg.nodes[e.sink])(v), x)
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
            fallback.append(free_unstored)
            ex.exec_count -= len(ids)
            for th in fallback:
                th(point)
            return
        for nid, out in zip(kept_ids, outs, strict=True):
            store.put(nid, 0, point, out)

    return thunk


def _take_gather(ex: Executor, node: Node, e: Edge) -> Callable[[Any], Any] | None:
    """A gather of input ``e`` of ``node`` that also frees the point it read (the region is
    its last reader), or None when the input cannot be taken whole: a slice, a selection or
    a condition, layout steps, or a table that is not a plain dict (block or rows table)."""
    pdg, store = ex.pdg, ex.store
    if e.select is not None or e.cond is not TRUE or e.to_batch is not None or e.batch_read:
        return None
    if any(isinstance(c, Slice) for c in e.phi):
        return None
    try:
        if input_layout(pdg.nodes[e.src], node, e).steps:
            return None
    except ValueError:
        return None
    tab = store.table(e.src, e.oid)
    if type(tab) is not dict or len(pdg.nodes[e.src].outputs) != 1:
        return None
    phi = ex._node_expr(e.phi, node)
    plain, _ = ex._make_input(node, e)
    src = e.src
    free = store.free

    def take(v: Any) -> Any:
        q = phi(v)
        if q not in tab:
            return plain(v)  # raises the gather's error
        x = tab[q]
        free(src, q)
        return x

    take.edge = e  # type: ignore[attr-defined]
    return take


# ops whose result never shares memory with an input (Torch: no views)
_FRESH = frozenset(
    {
        OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.POW, OpKind.NEG, OpKind.EXP,
        OpKind.LOG, OpKind.SQRT, OpKind.TANH, OpKind.ABS, OpKind.RELU, OpKind.SIGMOID,
        OpKind.SIGN, OpKind.MAXIMUM, OpKind.MINIMUM, OpKind.TANH_GRAD, OpKind.WHERE,
        OpKind.LT, OpKind.LE, OpKind.GT, OpKind.GE, OpKind.EQ, OpKind.NE,
        OpKind.LOGICAL_AND, OpKind.LOGICAL_OR, OpKind.LOGICAL_NOT,
    }
)  # fmt: skip


def in_place_members(
    nodes: Sequence[Node],
    plans: Sequence[Sequence[tuple[str, int]]],
    keep: Sequence[int],
    donated: Mapping[int, tuple[object, ...] | None],
) -> dict[int, int]:
    """For a backend writing results into donated buffers itself (Torch ``out=``): per
    donated external input ``k`` (with its ``(batch, shape, dtype)``), the member that writes
    its result into it, as ``{member: k}``. ``plans[j]``: member ``j``'s inputs, ``("ext", k)``
    or ``("int", member)``. The member must be stored (in ``keep``), of the input's
    signature, a binary elementwise op (``AbstractBackend.run_into`` may still decline at run
    time), and read no member that may alias the input (a non-elementwise op of it, or of
    such an alias: Torch views share memory); no later member may read the input or an
    alias, and no alias may be stored."""
    binary = {OpKind.ADD, OpKind.SUB, OpKind.MUL, OpKind.DIV, OpKind.MAXIMUM, OpKind.MINIMUM}
    stored = set(keep)
    out: dict[int, int] = {}
    for k, sig in donated.items():
        if sig is None:
            continue
        alias: set[int] = set()  # members that may share memory with the input
        for j, n in enumerate(nodes):
            if n.op.kind not in _FRESH and _reads(plans[j], k, alias):
                alias.add(j)
        if alias & stored:
            continue
        for m in range(len(nodes) - 1, -1, -1):
            n = nodes[m]
            if (
                m in out
                or m not in stored
                or n.op.kind not in binary
                or static_signature(n) != sig
                or any(kind == "int" and idx in alias for kind, idx in plans[m])
            ):
                continue
            if any(_reads(plans[j], k, alias) for j in range(m + 1, len(nodes))):
                break  # a later member reads the input: no earlier member may overwrite it
            out[m] = k
            break
    return out


def _reads(plan: Sequence[tuple[str, int]], k: int, alias: set[int]) -> bool:
    """Whether a member with input ``plan`` reads external input ``k`` or a member in ``alias``."""
    return any((kind == "ext" and idx == k) or (kind == "int" and idx in alias) for kind, idx in plan)

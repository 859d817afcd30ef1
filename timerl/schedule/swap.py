"""Swapping placed by isl (paper §6.2, Fig. 8) and the AST post-processing of memory statements (§6.3).

With ``CompileOptions(swap=True)`` every tensor whose points hold at least
``swap_threshold`` bytes each and whose domain has more than one symbolic dim (one dim is
always needed in memory) gets, per point ``p``:

* an **initial offload** ``O[p]`` after its production (rule 2 of Fig. 8);
* per **consumer** (a statement reading it; consumers whose uses of some point interleave
  in the frozen schedule are merged into one, so per point they run one after the other),
  a **fetch** ``G_c[p]`` before the consumer's first use of ``p`` (rule 3) and an
  **offload** ``O_c[p]`` after its last use, where a later consumer follows (rule 4: the
  offload of the consumer that runs first precedes the fetch of the next one);
* the free of ``p`` (``dealloc.py``) after all of them (rule 5): where no consumer
  follows, the free is the offload.

Like the frees, these statements are grafted into the *frozen* compute schedule as
extension nodes (offloads after the leaf of the use or production, fetches before the leaf
of the use: :func:`plan_swaps` gives the maps, ``dealloc.graft_frees`` grafts them) and the
AST is checked against the swap dependences (:func:`plan_swaps`' ``validity``); when isl's
AST is wrong the schedule without swapping is used (warning). Only the placement is
isl's: the compute order never changes.

Consumers in the next iteration of a loop after the production (``x[t + 1]`` reading
``x[t]``, :func:`_next_step`) leave no gap to swap in: they count as production, and so
do the setter points of a dynamic bound that the free waits for (``dealloc._bound_waits``:
which readers a point has is not known before them), so the initial offload follows them.
Not swapped (a debug line says why): tensors with no consumer left after that, nodes whose
every output is kept in the block store (slice-read buffers updated in place; outputs of a
swapped node kept there stay on the device) and values kept for checkpoints. At run time a scanned loop
(``runtime/scan.py``) holding swap statements runs unscanned, and a point kept as a row
of a scanned loop's stacked output is not moved (``PointStore.offload``).

:func:`postprocess` then simplifies the AST (paper §6.3): an offload followed, in the same
sequence and with no loop or ``If`` between, by a fetch of the same point is dropped with
the fetch (the value stays on the device), an offload followed by the free of the same
point is dropped (the free drops it from the device), a fetch of a point already fetched
is dropped, and a static loop holding only memory statements becomes one batched
statement whose point takes the loop's range as a :class:`~timerl.symbolic.Slice`
(``free %5(_c0, 0:8)``), run as one call over the points.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

import islpy as isl

from timerl.pdg.ir import PDG
from timerl.pdg.ops import OpKind
from timerl.schedule.ast import AstNode, Dealloc, Fetch, If, Loop, MemOp, Offload, Seq, inline_seqs
from timerl.schedule.isl import stmt_name
from timerl.symbolic import Add, Const, Le, Lt, Slice, Sym, free_symbols

log = logging.getLogger(__name__)

OFFLOAD_PREFIX, FETCH_PREFIX = "O", "G"
"""isl tuple names of the swap statements: ``O{k}`` / ``G{k}``."""

_NO_SWAP = (OpKind.CONST, OpKind.SET_SYMBOL, OpKind.SINK)


def swappable(pdg: PDG, threshold: int, exclude: frozenset[int] = frozenset()) -> frozenset[int]:
    """Nodes to swap: read by some data edge, more than one symbolic dim, at least
    ``threshold`` bytes per point (all outputs; dynamic bounds at 1), not in ``exclude``, and
    not a node of several outputs whose large ones only ``MERGE``s read, or reads of one point
    of the innermost dim (freed per output)."""
    from timerl.pdg.sizes import output_bytes

    # readers of each output other than MERGEs and reads of one point of the innermost dim
    readers: dict[tuple[int, int], bool] = {}
    for e in pdg.edges:
        if not e.order_only:
            key = (e.src, e.oid)
            last = e.phi[-1] if e.phi else None
            one = (
                last is not None
                and not isinstance(last, Slice)
                and not free_symbols(last) - set(pdg.static_bounds)
            )
            other = pdg.nodes[e.sink].op.kind is not OpKind.MERGE and not one
            readers[key] = readers.get(key, False) or other
    sizes = output_bytes(pdg)
    out = set()
    for n in pdg:
        total = sum(sizes[n.id])
        big = [o for o, b in enumerate(sizes[n.id]) if b >= threshold and 4 * b >= total]  # most of the bytes
        read = [o for o in range(len(n.outputs)) if (n.id, o) in readers]
        if not read or len(n.domain) < 2 or n.op.kind in _NO_SWAP or total < threshold:
            continue
        if n.id in exclude:
            log.debug("not swapping %s: it is block-stored or kept for checkpoints", n.label)
            continue
        if len(read) > 1 and big and not any(readers.get((n.id, o), False) for o in big):
            # an env step's observation, copied into the observations (swapped themselves) by the
            # next step, and read at T - 1 for the bootstrap value: freed per output once copied
            # (dealloc.py); swapping would move it whole, with the rewards read after the rollout
            log.debug("not swapping %s: its large outputs are only merged into other tensors", n.label)
            continue
        out.add(n.id)
    return frozenset(out)


@dataclass(frozen=True)
class SwapPlan:
    """What :func:`plan_swaps` grafts: ``after`` / ``before`` map each swap instance to the
    compute instance it follows / precedes; ``validity`` orders them (Fig. 8's rules),
    ``domain`` is their instances; ``offloads`` / ``fetches``: the nodes each ``O{k}`` /
    ``G{k}`` statement moves."""

    after: isl.UnionMap
    before: isl.UnionMap
    validity: isl.UnionMap
    domain: isl.UnionSet
    offloads: dict[int, tuple[int, ...]]
    fetches: dict[int, tuple[tuple[int, tuple[int, ...]], ...]]  # (node, outputs its consumer reads)


def _maps(um: isl.UnionMap) -> list[isl.Map]:
    out: list[isl.Map] = []
    um.foreach_map(out.append)
    return out


def _named(um: isl.UnionMap, name: str) -> isl.UnionMap:
    """``um`` with the tuple name of every domain set to ``name``."""
    out = isl.UnionMap.empty(um.get_space())
    for m in _maps(um):
        out = out.union(isl.UnionMap.from_map(m.set_tuple_name(isl.dim_type.in_, name)))
    return out


def _ident(dom: isl.UnionSet, src: str, dst: str) -> isl.UnionMap:
    """``src[p] -> dst[p]`` for ``p`` in ``dom`` (a set over one tuple)."""
    out = isl.UnionMap.empty(dom.get_space())
    sets: list[isl.Set] = []
    dom.foreach_set(sets.append)
    for s in sets:
        s = s.set_tuple_name(src)
        m = isl.Map.identity(s.get_space().map_from_set()).intersect_domain(s)
        out = out.union(isl.UnionMap.from_map(m.set_tuple_name(isl.dim_type.out, dst)))
    return out


def _lt(a: isl.UnionMap, b: isl.UnionMap) -> isl.UnionSet:
    """Points ``p`` with ``a(p)`` before ``b(p)`` (both single-valued, same domain tuple)."""
    both = a.domain().intersect(b.domain())
    return a.lex_lt_union_map(b).intersect(both.identity()).domain()


def plan_swaps(
    req: object, frees: object, swapped: frozenset[int], prog: object, theta: isl.UnionMap, run: isl.Set
) -> SwapPlan | None:
    """The swap statements of the nodes in ``swapped`` (see the module doc); ``req``: the
    ``dealloc.FreeRequest`` (PDG and statement of each node), ``frees``: the free statements
    (``dealloc._Frees``: reads and uses per free statement), ``theta``: the compute
    schedule restricted to the run's parameters. None when nothing is swapped."""
    from timerl.schedule.dealloc import free_name

    space = prog.context().get_space()
    after = isl.UnionMap.empty(space)
    before = isl.UnionMap.empty(space)
    validity = isl.UnionMap.empty(space)
    domain = isl.UnionSet.empty(space)
    offloads: dict[int, tuple[int, ...]] = {}
    fetches: dict[int, tuple[tuple[int, tuple[int, ...]], ...]] = {}
    read_oids = _read_outputs(req)
    waits: isl.UnionMap | None = None  # bound uses that are not data reads, at the run's parameters
    for k, members in frees.members.items():
        moved = tuple(m for m in members if m in swapped)
        if not moved:
            continue
        fk, st = free_name(k), frees.stmt[k]
        reads = frees.per[k].intersect_params(run)
        # production: the statement's own point, the uses of near consumers, and the setter
        # points of a dynamic bound the free waits for (which readers a point has is not
        # known before them: the initial offload waits too, like the free)
        if waits is None:  # the same for every free statement: computed once
            waits = frees.uses.intersect_params(run).subtract(frees.reads.intersect_params(run))
        prod_uses = _ident(reads.domain(), fk, stmt_name(st)).union(waits.intersect_domain(reads.domain()))
        groups: list[isl.UnionMap] = []
        for m in _maps(reads.subtract(prod_uses)):
            if not m.is_empty():
                groups.append(isl.UnionMap.from_map(m))
        near = _next_step(theta, prod_uses.range())
        groups, prod_uses = _after_production(_merge_interleaved(groups, theta), prod_uses, theta, near)
        if not groups:
            log.debug(
                "not swapping %s: no consumer far from its production", ", ".join(f"%{m}" for m in moved)
            )
            continue
        times = [g.apply_range(theta) for g in groups]
        first = [t.lexmin() for t in times]
        last = [t.lexmax() for t in times]
        read_pts = groups[0].domain()
        for g in groups[1:]:
            read_pts = read_pts.union(g.domain())
        # the initial offload, after production and the near uses: S[p] -> O0[p] -> F_k[p]
        j = len(offloads)
        o0 = f"{OFFLOAD_PREFIX}{j}"
        offloads[j] = moved
        prod = prod_uses.intersect_domain(read_pts)
        last_prod = prod.apply_range(theta).lexmax().apply_range(theta.reverse()).intersect(prod)
        after = after.union(_named(last_prod, o0))
        validity = validity.union(_named(prod, o0).reverse()).union(_ident(read_pts, o0, fk))
        domain = domain.union(_ident(read_pts, o0, fk).domain())
        offs: list[tuple[str, isl.UnionSet]] = []
        fets: list[str] = []
        for g, grp in enumerate(groups):
            jf = len(fetches)
            gname = f"{FETCH_PREFIX}{jf}"
            sinks = {m.get_tuple_name(isl.dim_type.out) for m in _maps(grp)}
            fetches[jf] = tuple(
                (x, tuple(sorted(set().union(*(read_oids.get((x, c), set()) for c in sinks))))) for x in moved
            )
            gdom = grp.domain()
            first_user = first[g].apply_range(theta.reverse()).intersect(grp)
            before = before.union(_named(first_user, gname))
            # G_g[p] before each use of p by the consumer, after O0[p], before the free
            validity = validity.union(_named(grp, gname)).union(_ident(gdom, gname, fk))
            validity = validity.union(_ident(gdom, o0, gname))
            domain = domain.union(_named(grp, gname).domain())
            fets.append(gname)
            later = isl.UnionSet.empty(space)
            for h in range(len(groups)):
                if h != g:
                    later = later.union(_lt(last[g], first[h]))
            if later.is_empty():  # the free moves the point out
                offs.append(("", later))
                continue
            jo = len(offloads)
            oname = f"{OFFLOAD_PREFIX}{jo}"
            offloads[jo] = moved
            last_user = last[g].apply_range(theta.reverse()).intersect(grp).intersect_domain(later)
            after = after.union(_named(last_user, oname))
            # O_g[p] after each use of p by the consumer, before the free
            validity = validity.union(_named(grp.intersect_domain(later), oname).reverse())
            validity = validity.union(_ident(later, oname, fk))
            domain = domain.union(_named(last_user, oname).domain())
            offs.append((oname, later))
        for g, (oname, later) in enumerate(offs):  # rule 4: O_g[p] before G_h[p] when g runs first
            if not oname:
                continue
            for h, gname in enumerate(fets):
                if h != g:
                    pts = _lt(last[g], first[h]).intersect(later)
                    validity = validity.union(_ident(pts, oname, gname))
    if not offloads:
        return None
    log.debug("swap: %d offload and %d fetch statements", len(offloads), len(fetches))
    return SwapPlan(after, before, validity, domain, offloads, fetches)


def _read_outputs(req: object) -> dict[tuple[int, str], set[int]]:
    """``(node, reading statement's isl name) -> outputs of the node it reads``: a fetch
    moves back only what its consumer reads (a node's outputs kept in the block store, or
    read only near their production, stay where they are)."""
    out: dict[tuple[int, str], set[int]] = {}
    for e in req.pdg.edges:
        if not e.order_only and e.sink in req.stmt_of:
            out.setdefault((e.src, stmt_name(req.stmt_of[e.sink])), set()).add(e.oid)
    return out


def _next_step(theta: isl.UnionMap, producer: isl.UnionSet) -> isl.UnionMap:
    """Time ``a -> b`` where ``b`` is in the next iteration of a loop of ``a``: at the first
    coordinate where they differ, one of the producer's loops (a coordinate that varies over
    ``producer``'s instances; a sequence position does not), ``b`` is one more. No gap is
    left to swap in between."""
    sets: list[isl.Set] = []
    theta.intersect_domain(producer).range().foreach_set(sets.append)
    n = max((x.dim(isl.dim_type.set) for x in sets), default=0)
    loops = [
        k
        for k in range(n)
        if any(
            k < x.dim(isl.dim_type.set)
            and not x.project_out(isl.dim_type.set, k + 1, x.dim(isl.dim_type.set) - k - 1)
            .project_out(isl.dim_type.set, 0, k)
            .is_singleton()
            for x in sets
        )
    ]
    if not loops:
        return isl.UnionMap.empty(theta.get_space())
    a = [f"a{j}" for j in range(n)]
    b = [f"b{j}" for j in range(n)]
    alts = [" and ".join([*(f"{b[i]} = {a[i]}" for i in range(k)), f"{b[k]} = {a[k]} + 1"]) for k in loops]
    text = f"{{ [{', '.join(a)}] -> [{', '.join(b)}] : {' or '.join(f'({x})' for x in alts)} }}"
    return isl.UnionMap.read_from_str(theta.get_ctx(), text)


def _after_production(
    groups: list[isl.UnionMap], prod_uses: isl.UnionMap, theta: isl.UnionMap, near: isl.UnionMap
) -> tuple[list[isl.UnionMap], isl.UnionMap]:
    """Consumers counted as production (the initial offload follows them): those whose
    first use of some point comes before the last use counted as production, and those
    whose first use of every point is in the next iteration of a loop after it
    (:func:`_next_step`: ``x[t + 1]`` reading ``x[t]``), where no gap is left to swap in."""
    groups = list(groups)
    changed = True
    while changed and groups:
        changed = False
        last = prod_uses.apply_range(theta).lexmax()
        soon = last.apply_range(near)
        for g, grp in enumerate(groups):
            first = grp.apply_range(theta).lexmin()
            dom = first.domain()
            if (
                not dom.subtract(_lt(last, first)).is_empty()
                or dom.subtract(first.intersect(soon).domain()).is_empty()
            ):
                prod_uses = prod_uses.union(grp)
                del groups[g]
                changed = True
                break
    return groups, prod_uses


def _merge_interleaved(groups: list[isl.UnionMap], theta: isl.UnionMap) -> list[isl.UnionMap]:
    """Consumers (uses ``F[p] -> C[q]``) merged until, at every point, each one's uses all
    run before or all after another's (rule 4 needs an order between their pairs)."""
    groups = list(groups)
    changed = True
    while changed and len(groups) > 1:
        changed = False
        times = [g.apply_range(theta) for g in groups]
        first = [t.lexmin() for t in times]
        last = [t.lexmax() for t in times]
        for a in range(len(groups)):
            for b in range(a + 1, len(groups)):
                apart = _lt(last[a], first[b]).union(_lt(last[b], first[a]))
                both = groups[a].domain().intersect(groups[b].domain())
                if not both.subtract(apart).is_empty():
                    groups[a] = groups[a].union(groups[b])
                    del groups[b]
                    changed = True
                    break
            if changed:
                break
    return groups


def expand_swaps(
    node: AstNode,
    offloads: Mapping[int, tuple[int, ...]],
    fetches: Mapping[int, tuple[tuple[int, tuple[int, ...]], ...]],
    num_outputs: Mapping[int, int] | None = None,
) -> AstNode:
    """Replace each ``Offload(k)`` / ``Fetch(k)`` of a swap statement by one per node it
    moves (a fetch naming the outputs its consumer reads, none when that is all of them)."""
    if isinstance(node, (Offload, Fetch)):
        if isinstance(node, Offload):
            out: list[AstNode] = [Offload(m, node.point) for m in offloads[node.node]]
        else:
            n_out = num_outputs or {}
            out = [
                Fetch(m, node.point, () if len(oids) == n_out.get(m, len(oids)) else oids)
                for m, oids in fetches[node.node]
            ]
        return out[0] if len(out) == 1 else Seq(tuple(out))
    if isinstance(node, Seq):
        return Seq(tuple(expand_swaps(c, offloads, fetches, num_outputs) for c in node.children))
    if isinstance(node, Loop):
        return replace(node, body=expand_swaps(node.body, offloads, fetches, num_outputs))
    if isinstance(node, If):
        return replace(
            node,
            then=expand_swaps(node.then, offloads, fetches, num_outputs),
            else_=None if node.else_ is None else expand_swaps(node.else_, offloads, fetches, num_outputs),
        )
    return node


# -- AST post-processing ---------------------------------------------------------------------


def postprocess(node: AstNode, dynamic: frozenset[Sym] = frozenset()) -> AstNode:
    """Redundant offload/fetch pairs removed, then memory-only static loops batched (module
    doc); ``dynamic``: the dynamic bounds (a loop over one is not static)."""
    return batch_memory_loops(drop_redundant_moves(node), dynamic)


def drop_redundant_moves(node: AstNode) -> AstNode:
    """Offload then fetch (or free) of the same point in one sequence, and repeated fetches
    of a point, removed (module doc)."""
    if isinstance(node, Loop):
        return replace(node, body=drop_redundant_moves(node.body))
    if isinstance(node, If):
        return replace(
            node,
            then=drop_redundant_moves(node.then),
            else_=None if node.else_ is None else drop_redundant_moves(node.else_),
        )
    if not isinstance(node, Seq):
        return node
    kids = [drop_redundant_moves(c) for c in inline_seqs(node.children)]
    gone: set[int] = set()
    for a, st in enumerate(kids):
        if a in gone or not isinstance(st, (Offload, Fetch)):
            continue
        for b in range(a + 1, len(kids)):
            nxt = kids[b]
            if isinstance(nxt, (Loop, If)):
                break
            if b in gone or not isinstance(nxt, MemOp) or nxt.node != st.node:
                continue
            if nxt.point != st.point:
                if isinstance(nxt, Offload) and isinstance(st, Fetch):
                    break  # another point moved out: keep what follows as it is
                continue
            if isinstance(st, Offload):
                if isinstance(nxt, Fetch):
                    gone.update((a, b))
                elif isinstance(nxt, Dealloc) and not nxt.outputs:
                    gone.add(a)
                break
            if isinstance(nxt, Fetch) and (not st.outputs or set(nxt.outputs) <= set(st.outputs)):
                gone.add(b)  # fetched twice with no offload between
                continue
            break
    out = tuple(c for k, c in enumerate(kids) if k not in gone)
    return out[0] if len(out) == 1 else Seq(out)


def _upper(loop: Loop) -> tuple[object, bool] | None:
    """``(stop, ok)``: the exclusive end of ``for (v = ..; v < E or v <= E; v += 1)``."""
    c, v = loop.cond, loop.var
    if isinstance(c, Lt) and c.args[0] == v:
        return c.args[1], True
    if isinstance(c, Le) and c.args[0] == v:
        return _plus(c.args[1], 1), True
    return None


def _offset(e: object, v: Sym) -> int | None:
    """``k`` when ``e`` is ``v + k`` (``k`` a constant), else None."""
    if e == v:
        return 0
    if isinstance(e, Add):
        a, b = e.args
        if a == v and isinstance(b, Const):
            return int(b.value)
        if b == v and isinstance(a, Const):
            return int(a.value)
    return None


def batch_memory_loops(node: AstNode, dynamic: frozenset[Sym] = frozenset()) -> AstNode:
    """A static loop (step 1, bounds free of dynamic bounds) whose body holds only memory
    statements, each naming the counter once as ``v + k`` and no dynamic bound (its value
    may differ per point of the range), becomes those statements with that coordinate a
    slice over the loop's range (one batched call each)."""
    if isinstance(node, Seq):
        return Seq(tuple(batch_memory_loops(c, dynamic) for c in node.children))
    if isinstance(node, If):
        return replace(
            node,
            then=batch_memory_loops(node.then, dynamic),
            else_=None if node.else_ is None else batch_memory_loops(node.else_, dynamic),
        )
    if not isinstance(node, Loop):
        return node
    body = batch_memory_loops(node.body, dynamic)
    loop = replace(node, body=body)
    stmts = inline_seqs((body,))
    up = _upper(loop)
    if (
        up is None
        or loop.inc != 1
        or (free_symbols(loop.init) | free_symbols(up[0])) & (dynamic | {loop.var})
        or not stmts
        or not all(isinstance(s, MemOp) for s in stmts)
    ):
        return loop
    out = []
    for s in stmts:
        uses = [k for k, c in enumerate(s.point) if not isinstance(c, Slice) and loop.var in free_symbols(c)]
        if len(uses) != 1 or any(isinstance(c, Slice) and loop.var in _slice_syms(c) for c in s.point):
            return loop
        if any(free_symbols(c) & dynamic for c in s.point):  # a bound's value per enclosing point
            return loop
        k = uses[0]
        off = _offset(s.point[k], loop.var)
        if off is None:
            return loop
        sl = Slice(_plus(loop.init, off), _plus(up[0], off))
        out.append(replace(s, point=(*s.point[:k], sl, *s.point[k + 1 :])))
    return out[0] if len(out) == 1 else Seq(tuple(out))


def _slice_syms(s: Slice) -> frozenset[Sym]:
    return free_symbols(s.start) | free_symbols(s.stop)


def _plus(e: object, k: int) -> object:
    if k == 0:
        return e
    if isinstance(e, Const):
        return Const(int(e.value) + k)
    return Add(e, Const(k))

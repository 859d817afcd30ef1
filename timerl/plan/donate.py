"""Buffer donation from the frozen schedule with frees (paper §6.2, issue 11 deliverable 3).

With ``CompileOptions(donate=True)`` (and ``dealloc``), a compiled region (a
:class:`~timerl.runtime.regions.FusedExec`) that is the *last reader* of an input point
``X[p]`` may hand ``X[p]``'s buffer to the backend, which then writes one of the region's
outputs into it instead of allocating a new one: ``w[i] <- w[i - 1] - lr * g[i]`` and the
Adam moments update their buffers in place, iteration after iteration.

**Which inputs** (:func:`plan_donations`, on the statements of one ``Seq`` after region
planning): for every ``Dealloc(X, p)`` (placed by isl after the last reader of ``X[p]``,
``schedule/dealloc.py``), walk back over the statements before it in the ``Seq``: frees are
skipped; the first statement that may read ``X[p]`` (:func:`~timerl.runtime.regions.may_read`)
is the last reader. A ``Loop`` or ``If`` met first ends the search (a reader may be inside).
The input is donated to that statement when

* no ``SET_SYMBOL`` runs between them (a free placed after a dynamic bound's setter may
  wait for it: before the setter, ``X[p]``'s readers are not determined);
* it is a region (``FusedExec``, or an ``Exec`` of a fusable node, made a region of one),
  ``X`` is not one of its members, and exactly one of its members' edges may read ``X[p]``,
  reading it at exactly ``p`` (no slice, condition, selection or batch read);
* ``X`` is not a DLPack UDF's output (its buffer may be the user's), has one output, with a
  static shape, and some output the region stores has ``X``'s
  batch, shape and dtype (XLA writes that output into the donated buffer; the number of
  donated inputs of one shape is at most the number of such outputs).

Since nothing between the region and the free reads ``X[p]``, the region may take the
value out of the store before it runs (the free that follows then finds nothing). The
other frees that follow the region and that neither it nor anything before them reads or
writes move to just before it (:func:`_free_early`): the same tensor is often stored
under two nodes (``m[i + 1]``, a ``MERGE``, stores the tensor of the update that defines
it), and a tensor is donated only when no other stored point holds it.

**At run time** (:func:`~timerl.runtime.regions.make_fused_thunk`) the donated input is
taken out of the store (a dict table of ``X``: not block- or rows-stored) and donated only
when nothing else holds the tensor object (its reference count): the same object may be
stored at other points (a ``MERGE`` stores its branch's tensor), and those must stay valid.
JAX: ``jax.jit(..., donate_argnums=...)``. Torch runs regions eagerly: the donated input is
taken out of the store before the region runs (one reference fewer while it runs), but no
op writes into it (see ``docs/memory.md``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from timerl.pdg.ir import PDG, Edge, Node, edges_by_sink
from timerl.pdg.ops import OpKind
from timerl.plan.fusable import fusable, static_signature, stored_members
from timerl.plan.regions import FusedExec, may_read
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq, walk
from timerl.symbolic import TRUE, Expr, Slice, free_symbols, substitute
from timerl.symbolic.simplify import affine_difference


def _reads_exactly(e: Edge, sink: Node, point: Sequence[Expr], src_point: Sequence[Expr]) -> bool:
    """Whether ``e`` (into ``sink`` run at ``point``) reads the source at exactly ``src_point``."""
    if (
        e.order_only
        or e.select is not None
        or e.cond is not TRUE
        or e.to_batch is not None
        or e.batch_read
        or len(e.phi) != len(src_point)
    ):
        return False
    mapping = dict(zip(sink.domain, point, strict=True))
    for comp, ps in zip(e.phi, src_point, strict=True):
        if isinstance(comp, Slice):
            return False
        if affine_difference(substitute(comp, mapping), ps) != 0:
            return False
    return True


def _frees_only(s: AstNode) -> bool:
    """An ``If`` or ``Seq`` holding nothing but frees (they read nothing)."""
    if not isinstance(s, (If, Seq)):
        return False
    leaves = [x for x in walk(s) if not isinstance(x, (If, Seq))]
    return bool(leaves) and all(isinstance(x, Dealloc) for x in leaves)


def _batched(st: Dealloc) -> bool:
    """A batched free (``schedule/swap.py``): a point with a range of coordinates."""
    return any(isinstance(c, Slice) for c in st.point)


def _mentions_dynamic(point: Sequence[Expr], pdg: PDG) -> bool:
    return any(free_symbols(c) & pdg.dynamic_bounds for c in point)


class _Donor:
    def __init__(self, pdg: PDG) -> None:
        self.pdg = pdg
        self._in = edges_by_sink(pdg)

    def readers(self, s: Exec, x: int, p: Sequence[Expr]) -> list[tuple[int, Edge]]:
        """``(member, edge)`` of statement ``s`` that may read ``x`` at ``p``."""
        members = s.members if isinstance(s, FusedExec) else (s.node,)
        out = []
        for m in members:
            sink = self.pdg.nodes[m]
            for e in self._in.get(m, ()):
                if e.src == x and not e.order_only and may_read(e, sink, s.point, p):
                    out.append((m, e))
        return out

    def setter(self, s: AstNode) -> bool:
        """Whether ``s`` runs a ``SET_SYMBOL`` (the frees after it may wait for the bound it sets)."""
        return type(s) is Exec and self.pdg.nodes[s.node].op.kind is OpKind.SET_SYMBOL

    def region_of(self, s: Exec) -> FusedExec | None:
        if isinstance(s, FusedExec):
            return s
        if type(s) is Exec and fusable(self.pdg.nodes[s.node]):
            return FusedExec(s.node, s.point, (s.node,))
        return None

    def free_slots(self, r: FusedExec) -> Counter[tuple[object, ...]]:
        """How many outputs of each ``(batch, shape, dtype)`` region ``r`` stores."""
        nodes = [self.pdg.nodes[m] for m in r.members]
        slots: Counter[tuple[object, ...]] = Counter()
        for k in stored_members(nodes, self.pdg):
            sig = static_signature(nodes[k])
            if sig is not None:
                slots[sig] += 1
        return slots


def _shared(x: Node) -> bool:
    """Whether ``x``'s tensors may share their buffer with the user's code: a UDF with
    ``array_io = "dlpack"`` hands back arrays it may still hold (a JAX env's last
    observation); writing into them would change the env's state."""
    return x.op.kind is OpKind.UDF and getattr(x.op.attr("fn"), "array_io", "numpy") == "dlpack"


def plan_donations(children: Sequence[AstNode], pdg: PDG) -> list[AstNode]:
    """The statements of one ``Seq`` (after region planning) with donated inputs marked on
    their regions (``FusedExec.donate``: ``(member, input id)`` pairs); see the module doc."""
    d = _Donor(pdg)
    out = list(children)
    used: dict[int, Counter[tuple[object, ...]]] = {}  # statement index -> signatures donated
    for j, st in enumerate(out):
        if not isinstance(st, Dealloc):
            continue
        x = pdg.nodes.get(st.node)
        if x is None:
            continue
        sig = static_signature(x)
        if sig is None or st.outputs or _mentions_dynamic(st.point, pdg) or _batched(st) or _shared(x):
            continue
        k = j - 1
        while k >= 0 and isinstance(out[k], Dealloc):
            k -= 1
        target = None
        while k >= 0:
            s = out[k]
            if _frees_only(s):
                k -= 1
                continue
            if isinstance(s, (Loop, If, Seq)) or d.setter(s):
                break  # a reader may be inside; a free waiting for a bound stays after its setter
            if isinstance(s, Exec):
                found = d.readers(s, x.id, st.point)
                if found:
                    target = (k, found)
                    break
            k -= 1
        if target is None:
            continue
        k, found = target
        s = out[k]
        assert isinstance(s, Exec)
        r = d.region_of(s)
        if r is None or x.id in r.members or len(found) != 1:
            continue
        m, e = found[0]
        if not _reads_exactly(e, pdg.nodes[m], s.point, st.point):
            continue
        if (m, e.iid) in r.donate:
            continue
        taken = used.setdefault(k, Counter())
        if taken[sig] >= d.free_slots(r)[sig]:
            continue
        taken[sig] += 1
        out[k] = FusedExec(r.node, r.point, r.members, r.donate + ((m, e.iid),))
    return _free_early(out, sorted(used), d)


def _free_early(stmts: list[AstNode], regions: Sequence[int], d: _Donor) -> list[AstNode]:
    """Move the frees that follow each donating region to just before it when neither the
    region nor anything up to the free may read (or write) the freed point: the same tensor
    may be stored under several nodes (a ``MERGE`` stores its branch's tensor), and the
    region may donate it only when no other stored point holds it."""
    moved: dict[int, list[Dealloc]] = {}
    gone: set[int] = set()
    for k in regions:
        j = k + 1
        while j < len(stmts) and isinstance(stmts[j], Exec):
            j += 1
        while j < len(stmts) and isinstance(stmts[j], Dealloc):
            f = stmts[j]
            assert isinstance(f, Dealloc)
            between = [s for s in stmts[k:j] if isinstance(s, Exec)]
            if any(d.setter(s) for s in between):
                break  # frees after a bound's setter may wait for it (dealloc's bound waits)
            if _mentions_dynamic(f.point, d.pdg) or _batched(f):
                j += 1
                continue
            if j not in gone and not any(
                f.node in (s.members if isinstance(s, FusedExec) else (s.node,))
                or d.readers(s, f.node, f.point)
                for s in between
            ):
                moved.setdefault(k, []).append(f)
                gone.add(j)
            j += 1
    out: list[AstNode] = []
    for k, s in enumerate(stmts):
        out.extend(moved.get(k, ()))
        if k not in gone:
            out.append(s)
    return out


def merge_moves(pdg: PDG, keep: frozenset[int] = frozenset()) -> frozenset[tuple[int, int]]:
    """``(merge, input id)`` pairs whose source point a ``MERGE`` may *move* into its own
    output (free it in the store once stored under the merge), provided the runtime finds
    that nothing else reads the source from the store (see below).

    A ``MERGE`` stores its branch's tensor object itself (``m[i + 1] = m_new[i]``), so the
    tensor is held under two points until both are freed, and cannot be donated meanwhile.
    Here: the reads of source ``S`` by merge ``X`` take one point each (no slice or
    selection), and no two points of ``X`` read the same point of ``S`` (isl: the union of
    these reads ``X[p] -> S[q]``, reversed, is single-valued). The interpreter moves only
    when every other reader of ``S`` reads it inside the compiled region that computes it
    (at ``S``'s own point, as the optimiser's update reads the new moment): then once
    ``S[q]`` is stored, the merge is its only reader. Values in ``keep`` (read after the
    run by checkpoints) are never moved.
    """
    from timerl.schedule.isl import IslProgram

    prog: IslProgram | None = None
    moves: set[tuple[int, int]] = set()
    for x in pdg:
        if x.op.kind is not OpKind.MERGE or x.id in keep:
            continue
        by_src: dict[int, list[Edge]] = {}
        for e in pdg.data_in_edges(x.id):
            by_src.setdefault(e.src, []).append(e)
        for sid, reads in by_src.items():
            src = pdg.nodes[sid]
            if sid in keep or len(src.outputs) != 1 or src.op.kind is OpKind.CONST:
                continue
            if any(
                r.select is not None
                or r.to_batch is not None
                or r.batch_read
                or any(isinstance(c, Slice) for c in r.phi)
                for r in reads
            ):
                continue
            if prog is None:
                prog = IslProgram(pdg)
            rel = None
            for r in reads:
                m = prog.edge_map(r).intersect_range(prog.node_domain(sid))
                rel = m if rel is None else rel.union(m)
            assert rel is not None
            if rel.intersect_params(prog.context()).reverse().is_single_valued():
                moves.update((x.id, r.iid) for r in reads)
    return frozenset(moves)

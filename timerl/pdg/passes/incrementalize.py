"""Incrementalization of large reductions (TimeRL §5.3, Alg. 3): gradient accumulation.

A reduction whose input exceeds a memory threshold is computed in blocks: a new symbolic
dim ``di`` (bound ``DI``, static) tiles the reduced axis into blocks of ``bs`` rows, the
reduction runs once per block, and the node itself becomes the last value of a recurrence
over the blocks that accumulates their results (``acc[di] = acc[di - 1] + part[di]``).
What the reduction reads is incrementalized recursively, so that the whole chain that
produces the big input runs per block; the dealloc pass then frees each block's values
after its partial result, and each partial result once added, so only one block of each
is live at once.

**Roots.** ``SUM`` (any ``dims``, ``keepdim``) tiles its largest static reduced axis when that is
axis 0 or no other axis of its input is longer (not the features of each row);
``MATMUL`` with 2-d per-point operands (the weight gradients ``X^T @ G`` that
:mod:`~timerl.pdg.passes.contract` makes, summing over the rollout's rows) tiles the
contracted axis. A root is taken when its input, as read (stacked slice axes included),
holds more than ``threshold`` bytes, or when that input is *heavy* along the axis (below)
and a block dim for the same axis length exists already (the loss summed over the rows of
a minibatch joins the gradients' blocks: otherwise the full forward pass would stay alive
for it). ``bs = threshold // (bytes per row)`` over the root's input and the heavy nodes
it recurses into; ``DI = ceil(N / bs)``; one block dim per axis length ``N``. When ``bs``
does not divide ``N``, the last block is shorter: block shapes are ``min(bs, N - bs*di)``.

**Recursion** (``IncRecursive``): a block copy of node ``n`` over axis ``a`` has ``n``'s
domain plus ``di`` and ``n``'s op, with axis ``a`` of its output ``min(bs, N - bs*di)``
long; each input is mapped to the axis it carries (elementwise ops by NumPy broadcasting
from the right; ``PERMUTE``, ``SQUEEZE``, ``UNSQUEEZE`` track the index; reductions,
softmaxes and ``CUMSUM`` over other axes keep it; a 2-d ``MATMUL``'s row or column; the
index rows of ``TAKE``; ``GATHER``; ``ONE_HOT``'s index). An input that does not carry the
axis (a broadcast mean, the weights) is read whole. An input that carries it is, in this
order of preference: read in blocks through its edge (a ``phi`` slice ``lo:hi`` of a
symbolic dim, or a slice read along a vectorized dim, becomes ``lo + bs*di : lo +
min(bs*di + bs, N)``); incrementalized recursively when its node is a supported pure op
over that axis and *heavy* (its output exceeds the threshold or one of its inputs along the
axis is heavy: a small per-row value computed from big activations is recursed into, or
the activations would stay alive for it; this extends Alg. 3's "below the threshold" to
the whole chain above the node); else read whole and cut by a new ``SLICE`` node (the
recursion stops: a node that is not vectorized along the axis, that creates it
(``EXPAND``, ``RESHAPE``), or that is small with small inputs). Block copies are memoized
per (node, axis, block dim), so the gradients of several weights share one chain per
block, and the originals are removed when nothing else reads them.

Postcondition: the same values up to float summation order; reductions the pass cannot
incrementalize are unchanged (logged at debug level). The new dims are appended to
``pdg.dims`` with static bounds; nothing else about the graph changes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from timerl.pdg.ir import PDG, Edge, Node, TensorSpec, edges_by_src
from timerl.pdg.ops import ELEMENTWISE_OPS, Op, OpKind
from timerl.symbolic import TRUE, Expr, Slice, Sym, evaluate, free_symbols, lift, smin
from timerl.symbolic.expr import cmp_eq, cmp_le
from timerl.symbolic.simplify import simplify

log = logging.getLogger(__name__)

_ITEMSIZE = {"float32": 4, "float64": 8, "int32": 4, "int64": 8, "bool": 1}
# Ops a block copy can run on a block of rows (the axis mapping is in ``_input_axes``).
_RECURSE = ELEMENTWISE_OPS | {
    OpKind.PERMUTE,
    OpKind.SQUEEZE,
    OpKind.UNSQUEEZE,
    OpKind.SUM,
    OpKind.MAX,
    OpKind.MIN,
    OpKind.SOFTMAX,
    OpKind.LOG_SOFTMAX,
    OpKind.CUMSUM,
    OpKind.MATMUL,
    OpKind.TAKE,
    OpKind.GATHER,
    OpKind.ONE_HOT,
}


@dataclass(frozen=True)
class _Blocks:
    """One new dim tiling an axis of length ``n`` into ``count`` blocks of ``bs``. With
    ``along``, the blocks are those of batch dim ``along`` (``batch_block_dim``); with
    ``per_index`` too, the axis is the rows of a contraction, ``per_index`` rows per index
    of ``along`` (the other stacked batch dims), block ``di`` the rows whose index of
    ``along`` is in its block (``rows_block_dim``): their order is the same in both
    operands, all that a sum over rows needs."""

    di: Sym
    bound: Sym
    n: int
    bs: int
    count: int
    along: Sym | None = None
    per_index: int = 0

    @property
    def start(self) -> Expr:
        return simplify(self.di * self.bs)

    @property
    def stop(self) -> Expr:
        end = simplify(self.di * self.bs + self.bs)
        return end if self.n % self.bs == 0 else smin(end, lift(self.n))

    @property
    def size(self) -> int | Expr:
        return self.bs if self.n % self.bs == 0 else simplify(self.stop - self.start)


def parse_threshold(value: str | int) -> int:
    """The threshold in bytes (``"64MiB"``, ``"1GB"`` or an int), as ``memory_budget`` takes it;
    :class:`~timerl.errors.TimeRLError` naming the option otherwise."""
    from timerl.errors import MemoryBudgetError, TimeRLError
    from timerl.units import parse_bytes

    try:
        return parse_bytes(value)
    except MemoryBudgetError as exc:
        raise TimeRLError(
            f"incrementalize={value!r} is not a size: give bytes (int) or a number with a unit, "
            "e.g. '64MiB' or '1GB' (or None to turn incrementalization off)"
        ) from exc


def _fixed(pdg: PDG, x: int | Expr) -> int | Expr:
    """``x`` as an int when it uses static bounds only (a slice ``0:T`` is ``T`` long)."""
    if isinstance(x, int) or not free_symbols(x) <= set(pdg.static_bounds):
        return x
    return int(evaluate(x, pdg.static_bounds))


def _static(shape: tuple) -> tuple[int, ...] | None:
    return tuple(shape) if all(isinstance(s, int) for s in shape) else None


def _itemsize(spec: TensorSpec) -> int:
    return _ITEMSIZE[spec.dtype.value]


def _named(n: Node) -> bool:
    """Batch dims named, and none padded to a bucket of a dynamic bound (``vectorize_dynamic``:
    its size is known per episode only, so it is not tiled)."""
    return len(n.batch_dims) == len(n.batch) and all(isinstance(b, int) for b in n.batch)


class _Stacked:
    """The stacked per-point axes in front of what ``sink`` reads through ``e`` (the runtime's
    layout, ``timerl/plan/layout.py``): source batch dims the sink lacks, and the one read by
    a slice (moved last among them, even when the sink has it: each point reads all its
    rows), then ``phi``'s slices but the ``to_batch`` one."""

    def __init__(self, pdg: PDG, e: Edge) -> None:
        src, sink = pdg.nodes[e.src], pdg.nodes[e.sink]
        self.ok = _named(src) and _named(sink)
        cur = list(src.batch_dims) + ([e.to_batch] if e.to_batch is not None else [])
        size: dict[Sym, int | Expr] = dict(zip(src.batch_dims, src.batch, strict=False))
        narrowed: Sym | None = None
        for d, comp in e.batch_read:
            if d not in cur:
                self.ok = False
                continue
            cur.remove(d)
            if isinstance(comp, Slice):
                narrowed = d
                size[d] = _fixed(pdg, simplify(comp.stop - comp.start))
                cur.append(d)
        # a dim read by a slice is a stacked axis even when the sink is vectorized over it
        # too (each point reads all the rows, e.g. a one-hot mask ``EQ(comp[0:T], s)``)
        kept = [d for d in cur if d in sink.batch_dims and d is not narrowed]
        self.batched = bool(kept)
        extra = [d for d in cur if d not in kept]
        slices = [(k, c) for k, c in enumerate(e.phi) if isinstance(c, Slice)]
        if e.to_batch is not None:
            slices = slices[1:]
        # ("batch", dim) | ("narrow", dim) | ("phi", index into phi)
        self.axes: list[tuple[str, object]] = [("narrow" if d is narrowed else "batch", d) for d in extra]
        self.axes += [("phi", k) for k, _ in slices]
        self.sizes: list[int | Expr] = [size.get(d, 0) for d in extra]
        self.sizes += [_fixed(pdg, simplify(c.stop - c.start)) for _, c in slices]
        self.batch_of_src = src.batch


def _read_shape(pdg: PDG, e: Edge) -> tuple[int | Expr, ...]:
    st = _Stacked(pdg, e)
    # a view of a lifted scan (``rows_to_batch``): the source's axis j + 1 is read as axis j
    own = pdg.nodes[e.src].outputs[e.oid].shape[int(e.rows_to_batch) :]
    return (*st.sizes, *(_fixed(pdg, x) for x in own))


def _input_axes(pdg: PDG, n: Node, a: int) -> list[int | None] | None:
    """Per data input of ``n``: the per-point axis that carries output axis ``a`` (None: the
    input does not carry it, read whole); None when ``n`` cannot run on blocks of ``a``."""
    kind = n.op.kind
    ins = pdg.data_in_edges(n.id)
    shapes = [_read_shape(pdg, e) for e in ins]
    out = n.outputs[0].shape
    r = len(out)
    if not 0 <= a < r:
        return None
    if kind in ELEMENTWISE_OPS:
        res: list[int | None] = []
        for s in shapes:
            k = a - (r - len(s))
            res.append(None if k < 0 or (isinstance(s[k], int) and s[k] == 1) else k)
        return res
    if kind is OpKind.PERMUTE:
        return [int(n.op.attr("dims")[a])]
    if kind is OpKind.UNSQUEEZE:
        d = int(n.op.attr("dim")) % r
        return None if a == d else [a - 1 if a > d else a]
    if kind is OpKind.SQUEEZE:
        d = int(n.op.attr("dim")) % (r + 1)
        return [a + 1 if a >= d else a]
    if kind in (OpKind.SUM, OpKind.MAX, OpKind.MIN):
        dims = n.op.attr("dims")
        dims = {int(dims)} if isinstance(dims, int) else {int(x) for x in dims}
        if n.op.attr("keepdim", False):
            return None if a in dims else [a]
        kept = [k for k in range(len(shapes[0])) if k not in dims]
        return [kept[a]]
    if kind in (OpKind.SOFTMAX, OpKind.LOG_SOFTMAX, OpKind.CUMSUM):
        return None if int(n.op.attr("dim")) % r == a else [a]
    if kind is OpKind.MATMUL:
        if len(shapes) != 2 or len(shapes[0]) != 2 or len(shapes[1]) != 2:
            return None
        return [0, None] if a == 0 else [None, 1]
    if kind is OpKind.TAKE:
        return [None, 0] if a == 0 else [a, None]
    if kind is OpKind.GATHER:
        return [a, a] if a < r else None
    if kind is OpKind.ONE_HOT:
        return [a] if a < r - 1 else None
    return None


class _Incrementalizer:
    def __init__(self, pdg: PDG, threshold: int) -> None:
        self.pdg = pdg
        self.threshold = threshold
        self.nodes = dict(pdg.nodes)
        self.edges: list[Edge] = list(pdg.edges)
        self.removed: set[int] = set()  # ids of original edges (by identity) replaced
        self.next_id = max(self.nodes, default=-1) + 1
        self.blocks: dict[int, _Blocks] = {}  # per axis length
        self.memo: dict[tuple[int, int, Sym], int] = {}
        self.heavy_memo: dict[tuple[int, int], tuple[bool, int]] = {}
        self.dims = list(pdg.dims)
        self.static = dict(pdg.static_bounds)
        self.batch_blocks: dict[tuple[Sym, int], _Blocks] = {}  # per (batch dim, its length)
        self.rows_blocks: dict[tuple[Sym, int, int], _Blocks] = {}  # (dim, length, rows per index)
        self.batch_ok: dict[tuple[int, Sym], tuple[bool, int]] = {}

    # -- analysis ---------------------------------------------------------------------
    def _bytes(self, n: Node) -> int | None:
        spec = n.outputs[0]
        s = _static(tuple(_fixed(self.pdg, x) for x in spec.shape))
        if s is None or not all(isinstance(b, int) for b in n.batch):
            return None
        return math.prod(n.batch) * math.prod(s) * _itemsize(spec)

    def recursable(self, n: Node, a: int, size: int) -> list[int | None] | None:
        """Input axes of ``n`` over its output axis ``a`` of length ``size`` (None: it cannot run
        on blocks: effectful, conditional, several outputs, or an op without a rule)."""
        if n.op.kind not in _RECURSE or n.op.effectful or n.cond is not TRUE or len(n.outputs) != 1:
            return None
        if n.op.symbols() or not _named(n):
            return None
        s = n.outputs[0].shape
        if not 0 <= a < len(s) or _fixed(self.pdg, s[a]) != size:
            return None
        if any(e.order_only for e in self.pdg.in_edges(n.id)):
            return None
        return _input_axes(self.pdg, n, a)

    def heavy(self, nid: int, a: int, size: int) -> tuple[bool, int]:
        """Whether node ``nid``'s output along axis ``a`` is heavy (module doc), and the most
        bytes per row among the heavy nodes recursion would copy."""
        key = (nid, a)
        if key in self.heavy_memo:
            return self.heavy_memo[key]
        self.heavy_memo[key] = (False, 0)  # cycles: not heavy through themselves
        n = self.pdg.nodes[nid]
        axes = self.recursable(n, a, size)
        if axes is None:
            return (False, 0)
        nbytes = self._bytes(n) or 0
        row = nbytes // size
        hv = nbytes > self.threshold
        for e, k in zip(self.pdg.data_in_edges(nid), axes, strict=True):
            if k is None:
                continue
            st = _Stacked(self.pdg, e)
            j = k - len(st.axes)
            if j < 0:
                continue
            j += int(e.rows_to_batch)
            h, r = self.heavy(e.src, j, size)
            if h:
                hv, row = True, max(row, r)
        self.heavy_memo[key] = (hv, row)
        return hv, row

    # -- rewriting ----------------------------------------------------------------------
    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def block_dim(self, n: int, row_bytes: int) -> _Blocks | None:
        if n in self.blocks:
            return self.blocks[n]
        bs = max(1, self.threshold // max(1, row_bytes))
        if bs >= n:
            return None
        # a divisor of n not under half the block: equal blocks (no shorter last block, whose
        # shapes would be traced again by compiled regions)
        bs = next((d for d in range(bs, (bs + 1) // 2 - 1, -1) if d > 0 and n % d == 0), bs)
        self.blocks[n] = self._new_blocks(n, bs)
        return self.blocks[n]

    def block_input(self, sink: Node, e: Edge, k: int, blk: _Blocks, new_sink: int) -> list[Edge]:
        """Edges (and new nodes) feeding input ``e.iid`` of block copy ``new_sink`` of ``sink`` with
        the block of its per-point axis ``k``."""
        st = _Stacked(self.pdg, e)
        dom = (*sink.domain, blk.di)
        if blk.per_index:  # rows of a contraction over a batch dim: only block copies
            cid = self.copy(self.pdg.nodes[e.src], k - len(st.axes), blk) if k >= len(st.axes) else None
            if cid is None or e.oid != 0:
                raise _NoBlocks(f"input {e.iid} of {sink.label} cannot run on blocks of {blk.along}")
            return [replace(e, sink=new_sink, src=cid, phi=(*e.phi, blk.di))]
        if k < len(st.axes):
            kind, what = st.axes[k]
            whole = isinstance(st.sizes[k], int) and st.sizes[k] == blk.n
            if kind == "phi" and whole:
                c = e.phi[what]  # type: ignore[index]
                phi = list(e.phi)
                phi[what] = Slice(simplify(c.start + blk.start), simplify(c.start + blk.stop))  # type: ignore[index]
                return [replace(e, sink=new_sink, phi=tuple(phi))]
            elif kind == "narrow" and whole:
                br = []
                for d, comp in e.batch_read:
                    if d is what and isinstance(comp, Slice):
                        comp = Slice(simplify(comp.start + blk.start), simplify(comp.start + blk.stop))
                    br.append((d, comp))
                return [replace(e, sink=new_sink, batch_read=tuple(br))]
            return self.slice_read(sink, e, k, blk, new_sink, dom, st)
        j = k - len(st.axes) + int(e.rows_to_batch)
        src = self.pdg.nodes[e.src]
        if e.oid == 0 and self.heavy(src.id, j, blk.n)[0]:
            cid = self.copy(src, j, blk)
            if cid is not None:
                phi = (*e.phi, blk.di)
                return [replace(e, sink=new_sink, src=cid, phi=phi)]
        return self.slice_read(sink, e, k, blk, new_sink, dom, st)

    def slice_read(
        self, sink: Node, e: Edge, k: int, blk: _Blocks, new_sink: int, dom: tuple[Sym, ...], st: _Stacked
    ) -> list[Edge]:
        shape = list(_read_shape(self.pdg, e))
        shape[k] = blk.size
        sid = self._new_id()
        batch = {"batch": sink.batch, "batch_dims": sink.batch_dims} if st.batched else {}
        self.nodes[sid] = Node(
            sid,
            Op.make(OpKind.SLICE, dim=k, start=blk.start, stop=blk.stop),
            dom,
            (TensorSpec(tuple(shape), self.pdg.nodes[e.src].outputs[e.oid].dtype),),
            1,
            where=sink.where,
            **batch,
        )
        return [replace(e, sink=sid, iid=0), Edge(new_sink, sid, e.iid, 0, dom)]

    def copy(self, n: Node, a: int, blk: _Blocks) -> int | None:
        key = (n.id, a, blk.di)
        if key in self.memo:
            return self.memo[key]
        if blk.per_index and _contracted_rows(n) and a == 0:
            return self.copy_rows(n, blk)
        axes = self.recursable(n, a, blk.n)
        if axes is None:
            return None
        cid = self._new_id()
        self.memo[key] = cid
        shape = list(n.outputs[0].shape)
        shape[a] = blk.size
        self.nodes[cid] = replace(
            n, id=cid, domain=(*n.domain, blk.di), outputs=(replace(n.outputs[0], shape=tuple(shape)),)
        )
        self.feed(n, axes, blk, cid)
        return cid

    def feed(self, n: Node, axes: list[int | None], blk: _Blocks, cid: int) -> None:
        for e, k in zip(self.pdg.data_in_edges(n.id), axes, strict=True):
            if k is None:
                self.edges.append(replace(e, sink=cid))
            else:
                self.edges += self.block_input(n, e, k, blk, cid)

    def root(self, r: Node, axes: list[int | None] | None, blk: _Blocks) -> None:
        """``r`` (a SUM or a contraction) becomes the last value of a recurrence over the blocks
        accumulating its block copy's results: ``acc[0] = part[0]``, ``acc[di] = acc[di - 1] +
        part[di]``, ``r = acc[DI - 1]``, so each partial result is freed once added."""
        di = blk.di
        dom = (*r.domain, di)
        part, add, acc = self._new_id(), self._new_id(), self._new_id()
        self.nodes[part] = replace(r, id=part, domain=dom)
        if axes is None:  # a sum over a batch dim's stacked rows (:meth:`batch_sum_input`)
            self.edges.append(self.batch_sum_input(r, blk, part))
        else:
            self.feed(r, axes, blk, part)
        later = cmp_le(lift(1), di)
        self.nodes[add] = replace(r, id=add, op=Op.make(OpKind.ADD), domain=dom, cond=later, num_inputs=2)
        self.nodes[acc] = replace(r, id=acc, op=Op.make(OpKind.MERGE), domain=dom, num_inputs=2)
        self.nodes[r.id] = replace(r, op=Op.make(OpKind.IDENTITY), num_inputs=1)
        drop = {id(e) for e in self.pdg.in_edges(r.id) if not e.order_only}
        self.edges = [e for e in self.edges if id(e) not in drop]
        here = tuple(r.domain)
        self.edges += [
            Edge(acc, part, 0, 0, dom, cond=cmp_eq(di, lift(0))),
            Edge(acc, add, 1, 0, dom, cond=later),
            Edge(add, acc, 0, 0, (*here, simplify(di - 1))),
            Edge(add, part, 1, 0, dom),
            Edge(r.id, acc, 0, 0, (*here, simplify(blk.bound - 1))),
        ]

    # -- blocks of a batch dim (the rows of a rollout vectorized over ``t``) ---------------
    def can_batch(self, nid: int, d: Sym, n: int) -> tuple[bool, int]:
        """Whether node ``nid`` (vectorized over ``d``, ``n`` long) can run on blocks of ``d``,
        with every input that varies along ``d`` read in blocks (a stacked read ``x[0:T]``
        of a node over ``t``, or a block copy of a node vectorized over ``d``), and the most
        bytes per index of ``d`` among the nodes that would be copied."""
        key = (nid, d)
        if key in self.batch_ok:
            return self.batch_ok[key]
        self.batch_ok[key] = (False, 0)  # cycles
        x = self.pdg.nodes[nid]
        if (
            x.op.effectful
            or x.op.kind in _NOT_PER_ELEMENT
            or _contracted_rows(x)
            or x.op.symbols()
            or x.cond is not TRUE
            or len(x.outputs) != 1
            or not _named(x)
            or d not in x.batch_dims
            or x.batch[x.batch_dims.index(d)] != n
            or any(e.order_only for e in self.pdg.in_edges(nid))
        ):
            return (False, 0)
        most = (self._bytes(x) or 0) // n
        for e in self.pdg.data_in_edges(nid):
            src = self.pdg.nodes[e.src]
            if e.select is not None:
                return (False, 0)
            if e.to_batch is d:
                c = next((c for c in e.phi if isinstance(c, Slice)), None)
                length = src.outputs[e.oid].shape[0] if c is None else simplify(c.stop - c.start)
                if _fixed(self.pdg, length) != n:
                    return (False, 0)
            elif d in src.batch_dims:
                ok, b = self.can_batch(src.id, d, n)
                if not ok or any(y is d for y, _ in e.batch_read):
                    return (False, 0)
                most = max(most, b)
        self.batch_ok[key] = (True, most)
        return self.batch_ok[key]

    def batch_block_dim(self, d: Sym, n: int, per_index: int) -> _Blocks | None:
        """Blocks of batch dim ``d`` (``n`` long) holding ``threshold`` bytes, ``per_index`` bytes per
        index of ``d``: equal blocks (a divisor of ``n``), one block dim per ``(d, n)``."""
        if (d, n) in self.batch_blocks:
            return self.batch_blocks[(d, n)]
        bs = max(1, self.threshold // max(1, per_index))
        if bs >= n:
            return None
        bs = next(k for k in range(bs, 0, -1) if n % k == 0)
        blk = self._new_blocks(n, bs, along=d)
        self.batch_blocks[(d, n)] = blk
        return blk

    def _new_blocks(self, n: int, bs: int, along: Sym | None = None) -> _Blocks:
        """A new block dim ``di<k>`` (a free name) with static bound ``ceil(n / bs)``."""
        k = len(self.blocks) + len(self.batch_blocks)
        names = {s.name for s, _ in self.dims}
        while f"di{k}" in names:
            k += 1
        blk = _Blocks(Sym(f"di{k}"), Sym(f"DI{k}", is_bound=True), n, bs, -(-n // bs), along=along)
        self.dims.append((blk.di, blk.bound))
        self.static[blk.bound] = blk.count
        log.debug("incrementalize: new dim %s < %d tiles %s of %d in blocks of %d", blk.di, blk.count,
                  "an axis" if along is None else along, n, bs)  # fmt: skip
        return blk

    def rows_block_dim(self, bb: _Blocks, per_index: int) -> _Blocks:
        """The rows of a contraction over ``bb``'s batch dim, ``per_index`` rows per index."""
        key = (bb.along, bb.n, per_index)
        if key not in self.rows_blocks:
            self.rows_blocks[key] = replace(bb, n=bb.n * per_index, bs=bb.bs * per_index, per_index=per_index)
        return self.rows_blocks[key]

    def copy_batch(self, x: Node, bb: _Blocks) -> int:
        """A copy of ``x`` (``can_batch``) over one block of ``bb.along`` per point of ``bb.di``."""
        d = bb.along
        key = (x.id, -1, bb.di)
        if key in self.memo:
            return self.memo[key]
        cid = self._new_id()
        self.memo[key] = cid
        batch = tuple(bb.bs if y is d else b for y, b in zip(x.batch_dims, x.batch, strict=True))
        self.nodes[cid] = replace(x, id=cid, domain=(*x.domain, bb.di), batch=batch)
        for e in self.pdg.data_in_edges(x.id):
            src = self.pdg.nodes[e.src]
            k = next((j for j, c in enumerate(e.phi) if isinstance(c, Slice)), None)
            if e.to_batch is d and k is None:  # axis 0 of each point becomes d: its block, cut
                self.edges.append(replace(e, src=self._cut_rows(x, e, bb), phi=(*x.domain, bb.di), sink=cid))
            elif e.to_batch is d:
                c = e.phi[k]  # type: ignore[index]
                phi = (
                    *e.phi[:k],
                    Slice(simplify(c.start + bb.start), simplify(c.start + bb.stop)),
                    *e.phi[k + 1 :],
                )  # type: ignore[index]
                self.edges.append(replace(e, sink=cid, phi=phi))
            elif d in src.batch_dims:
                self.edges.append(replace(e, sink=cid, src=self.copy_batch(src, bb), phi=(*e.phi, bb.di)))
            else:
                self.edges.append(replace(e, sink=cid))
        return cid

    def _cut_rows(self, x: Node, e: Edge, bb: _Blocks) -> int:
        """A ``SLICE`` node over ``x``'s domain and ``bb.di``: the block of axis 0 of what ``x``
        reads through ``e`` (a per-point axis that ``e`` makes ``x``'s batch dim)."""
        src = self.pdg.nodes[e.src]
        spec = src.outputs[e.oid]
        sid = self._new_id()
        self.nodes[sid] = Node(
            sid,
            Op.make(OpKind.SLICE, dim=0, start=bb.start, stop=bb.stop),
            (*x.domain, bb.di),
            (TensorSpec((bb.bs, *spec.shape[1:]), spec.dtype),),
            1,
            where=x.where,
            batch=src.batch,
            batch_dims=src.batch_dims,
        )
        self.edges.append(Edge(sid, e.src, 0, e.oid, e.phi, cond=e.cond, batch_read=e.batch_read))
        return sid

    def block_read(self, e: Edge, bb: _Blocks, sink: int) -> Edge:
        """Edge ``e`` (a stacked read ``batch[d = lo:hi]`` of a node vectorized over ``d``,
        ``hi - lo`` = the whole dim) for ``sink``: a block copy of the source when it
        can run on blocks, else the block's rows of the whole source."""
        d, src = bb.along, self.pdg.nodes[e.src]
        if self.can_batch(src.id, d, bb.n)[0]:
            br = tuple((y, Slice(lift(0), lift(bb.bs)) if y is d else c) for y, c in e.batch_read)
            return replace(e, sink=sink, src=self.copy_batch(src, bb), phi=(*e.phi, bb.di), batch_read=br)
        br = tuple(
            (y, Slice(simplify(c.start + bb.start), simplify(c.start + bb.stop)) if y is d else c)
            for y, c in e.batch_read
        )
        return replace(e, sink=sink, batch_read=br)

    def copy_rows(self, n: Node, blk: _Blocks) -> int | None:
        """A copy of a contraction's row reshape (``contract``) over the rows of one block of
        ``blk.along``: it reads that block of the batch dim (stacked last), so its rows are
        ``per_index`` per index of the block."""
        (e,) = self.pdg.data_in_edges(n.id)
        if _rows_signature(self.pdg, e) != (blk.along, blk.n // blk.per_index, blk.per_index):
            return None
        bb = self.batch_blocks[(blk.along, blk.n // blk.per_index)]
        cid = self._new_id()
        self.memo[(n.id, 0, blk.di)] = cid
        spec = n.outputs[0]
        shape = (blk.bs, *(_fixed(self.pdg, x) for x in spec.shape[1:]))
        self.nodes[cid] = replace(
            n, id=cid, domain=(*n.domain, blk.di), outputs=(replace(spec, shape=shape),)
        )
        self.edges.append(self.block_read(e, bb, cid))
        return cid

    def batch_sum_input(self, r: Node, bb: _Blocks, part: int) -> Edge:
        (e,) = self.pdg.data_in_edges(r.id)
        return self.block_read(e, bb, part)

    def snapshot(self) -> tuple:
        return (dict(self.nodes), list(self.edges), dict(self.memo), self.next_id, list(self.dims),
                dict(self.static), dict(self.batch_blocks), dict(self.rows_blocks))  # fmt: skip

    def restore(self, snap: tuple) -> None:
        (self.nodes, self.edges, self.memo, self.next_id, self.dims, self.static, self.batch_blocks,
         self.rows_blocks) = snap  # fmt: skip


class _NoBlocks(Exception):
    """A chain that cannot run on blocks of a batch dim (the root is left whole)."""


# Ops that mix the elements of a batch axis or evaluate the point (a copy over a block of the
# batch would see other elements or indices), and ops that are never worth copying.
_NOT_PER_ELEMENT = frozenset(
    {OpKind.CONST, OpKind.EVAL_SYMBOL, OpKind.MERGE, OpKind.SET_SYMBOL, OpKind.SINK, OpKind.UDF}
)


def _contracted_rows(n: Node) -> bool:
    return n.op.kind is OpKind.RESHAPE and bool(n.op.attr("contracted_rows", False))


def _rows_signature(pdg: PDG, e: Edge) -> tuple[Sym, int, int] | None:
    """``(d, length of d, rows per index of d)`` of a contraction's row reshape reading ``e``:
    its stacked axes are the source's batch dims with ``d`` read whole by a slice (stacked
    last: each index of ``d`` has ``per_index`` rows, one per index of the others), no
    ``phi`` slice."""
    st = _Stacked(pdg, e)
    if not st.ok or not st.axes or st.axes[-1][0] != "narrow" or any(k == "phi" for k, _ in st.axes):
        return None
    if not all(isinstance(x, int) for x in st.sizes):
        return None
    d = st.axes[-1][1]
    src = pdg.nodes[e.src]
    if st.sizes[-1] != src.batch[src.batch_dims.index(d)]:
        return None
    return d, int(st.sizes[-1]), math.prod(int(x) for x in st.sizes[:-1])  # type: ignore[return-value]


def _trace_rows(pdg: PDG, nid: int, a: int) -> tuple[Sym, int, int] | None:
    """The rows signature (:func:`_rows_signature`) of the row reshape that axis ``a`` of node
    ``nid``'s output comes from, through permutes; None when it comes from elsewhere."""
    for _ in range(8):
        n = pdg.nodes[nid]
        ins = pdg.data_in_edges(nid)
        if _contracted_rows(n) and a == 0 and len(ins) == 1:
            return _rows_signature(pdg, ins[0])
        if n.op.kind is not OpKind.PERMUTE or len(ins) != 1 or ins[0].phi != tuple(n.domain) or n.batch:
            return None
        a, nid = int(n.op.attr("dims")[a]), ins[0].src
    return None


def _over_batch_rows(pdg: PDG, r: Node) -> bool:
    """Whether ``r`` contracts rows that row reshapes stack from a batch dim (:func:`_batch_root`
    tiles that dim; tiling the reshaped rows would read them whole)."""
    ins = pdg.data_in_edges(r.id)
    if r.op.kind is not OpKind.MATMUL or len(ins) != 2:
        return False
    return _trace_rows(pdg, ins[0].src, 1) is not None and _trace_rows(pdg, ins[1].src, 0) is not None


def _root_axes(pdg: PDG, r: Node) -> tuple[int, list[int | None], int, int] | None:
    """``(N, input axes, input bytes, row bytes)`` of a reduction that could be tiled."""
    ins = pdg.data_in_edges(r.id)
    if r.cond is not TRUE or any(e.order_only for e in pdg.in_edges(r.id)) or len(r.outputs) != 1:
        return None
    if not _named(r) or not all(_named(pdg.nodes[e.src]) for e in ins):
        return None  # a batch padded per episode (dynamic T) has no static row count
    if r.op.kind is OpKind.SUM:
        if len(ins) != 1:
            return None
        shape = _read_shape(pdg, ins[0])
        dims = r.op.attr("dims")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        cand = [(shape[d], d) for d in dims if 0 <= d < len(shape) and isinstance(shape[d], int)]
        if not cand:
            return None
        n, a = max(cand)
        if a != 0 and any(isinstance(x, int) and x > n for x in shape):
            return None  # a sum over the features of each row: the rows are the long axis
        axes: list[int | None] = [a]
    elif r.op.kind is OpKind.MATMUL:
        if len(ins) != 2:
            return None
        s0, s1 = (_read_shape(pdg, e) for e in ins)
        if len(s0) != 2 or len(s1) != 2 or not all(isinstance(x, int) for x in (*s0, *s1)):
            return None
        if s0[1] != s1[0] or s0[1] < max(s0[0], s1[1]):  # contractions over the long axis only
            return None
        n, axes = s0[1], [1, 0]
    else:
        return None
    total = 0
    for e in ins:
        s = _static(_read_shape(pdg, e))
        if s is None:
            return None
        st = _Stacked(pdg, e)
        b = math.prod(r.batch) if st.batched else 1
        total += b * math.prod(s) * _itemsize(pdg.nodes[e.src].outputs[e.oid])
    if n < 2:
        return None
    return n, axes, total, total // n


def _phi_blocks(pdg: PDG, r: Node, axes: list[int | None], n: int) -> bool:
    """Whether one of ``r``'s inputs stacks the axis from a slice of a symbolic dim (its
    points are gathered per block: the stacked copy shrinks to a block)."""
    for e, k in zip(pdg.data_in_edges(r.id), axes, strict=True):
        if k is None:
            continue
        st = _Stacked(pdg, e)
        size = st.sizes[k] if k < len(st.axes) else None
        if st.axes[k : k + 1] and st.axes[k][0] == "phi" and isinstance(size, int) and size == n:
            return True
    return False


def incrementalize(pdg: PDG, threshold: int) -> PDG:
    """Tile every reduction over more than ``threshold`` bytes along a new dim (module doc)."""
    inc = _Incrementalizer(pdg, threshold)
    done: list[Node] = []
    roots = [n for n in pdg if n.op.kind in (OpKind.SUM, OpKind.MATMUL)]
    info = {r.id: _root_axes(pdg, r) for r in roots}
    # big reductions first (they choose the block size), then reductions of heavy chains
    for phase in (0, 1):
        for r in roots:
            got = info[r.id]
            if got is None or r in done or _over_batch_rows(pdg, r):
                continue
            n, axes, total, row = got
            heavy = [
                inc.heavy(e.src, k - len(_Stacked(pdg, e).axes), n)
                for e, k in zip(pdg.data_in_edges(r.id), axes, strict=True)
                if k is not None and k >= len(_Stacked(pdg, e).axes)
            ]
            if phase == 0 and total <= threshold:
                continue
            if phase == 1 and not (n in inc.blocks and any(h for h, _ in heavy)):
                continue
            if not any(h for h, _ in heavy) and not _phi_blocks(pdg, r, axes, n):
                log.debug("incrementalize: %s reads its input whole (no chain to tile): kept", r.label)
                continue
            row = max([row, *(rb for h, rb in heavy if h)])
            blk = inc.block_dim(n, row)
            if blk is None:
                log.debug(
                    "incrementalize: %s: a block of its %d rows already exceeds the threshold", r.label, n
                )
                continue
            inc.root(r, axes, blk)
            done.append(r)
            log.debug("incrementalize: %s in %d blocks of %d along %s", r.label, blk.count, blk.bs, blk.di)
    for r in roots:
        if r not in done and _batch_root(pdg, inc, r, info[r.id]):
            done.append(r)
    if not done:
        return pdg
    out = pdg.with_(dims=tuple(inc.dims), nodes=inc.nodes, edges=tuple(inc.edges), static_bounds=inc.static)
    return _drop_unread(out, pdg)


def _batch_root(pdg: PDG, inc: _Incrementalizer, r: Node, got: tuple | None) -> bool:
    """Tile a reduction over a batch dim ``d`` (the rows of a rollout vectorized over ``t``):
    a contraction whose rows come from row reshapes of stacked reads ``x[0:T]`` (both operands
    alike), or a sum over such a stacked read; what it reads runs per block of ``d``
    (:meth:`_Incrementalizer.copy_batch`). Taken when its input exceeds the threshold or a
    block dim of ``d`` exists already; False (the graph unchanged) otherwise."""
    ins = pdg.data_in_edges(r.id)
    if r.cond is not TRUE or len(r.outputs) != 1 or any(e.order_only for e in pdg.in_edges(r.id)):
        return False
    total = got[2] if got is not None else None
    if r.op.kind is OpKind.MATMUL and len(ins) == 2:
        sigs = {_trace_rows(pdg, ins[0].src, 1), _trace_rows(pdg, ins[1].src, 0)}
        if len(sigs) != 1 or None in sigs or any(_Stacked(pdg, e).axes for e in ins):
            return False
        ((d, n, per),) = sigs
        per_index = 0
        for e in ins:
            s = _static(_read_shape(pdg, e))
            if s is None or len(s) != 2:
                return False
            per_index += math.prod(s) * _itemsize(pdg.nodes[e.src].outputs[e.oid]) // n
        axes: list[int | None] | None = [1, 0]
    elif r.op.kind is OpKind.SUM and len(ins) == 1:
        st = _Stacked(pdg, ins[0])
        dims = r.op.attr("dims")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if r.op.attr("keepdim", False) or not st.ok or len(st.axes) != 1 or st.axes[0][0] != "narrow":
            return False
        src = pdg.nodes[ins[0].src]
        d, n = st.axes[0][1], st.sizes[0]
        if 0 not in dims or not isinstance(n, int) or n != src.batch[src.batch_dims.index(d)]:
            return False
        per, axes = 0, None
        per_index = (inc._bytes(src) or 0) // n
    else:
        return False
    ok, chain = inc.can_batch(ins[0].src, d, n) if axes is None else (True, 0)
    if not ok:
        return False
    total = per_index * n if total is None else total
    if total <= inc.threshold and (d, n) not in inc.batch_blocks:
        return False
    if axes is not None:  # the chains above both row reshapes
        for e in ins:
            src = e.src
            while not _contracted_rows(pdg.nodes[src]):
                src = pdg.data_in_edges(src)[0].src
            (re,) = pdg.data_in_edges(src)
            chain = max(chain, inc.can_batch(re.src, d, n)[1])
    snap = inc.snapshot()
    bb = inc.batch_block_dim(d, n, max(per_index, chain))
    if bb is None:
        return False
    try:
        inc.root(r, axes, inc.rows_block_dim(bb, per) if axes is not None else bb)
    except _NoBlocks as exc:
        log.debug("incrementalize: %s not tiled along %s: %s", r.label, d, exc)
        inc.restore(snap)
        return False
    log.debug("incrementalize: %s in %d blocks of %d along batch dim %s", r.label, bb.count, bb.bs, d)
    return True


def _drop_unread(pdg: PDG, before: PDG) -> PDG:
    """Remove pure nodes that had readers before the pass and have none now (the originals
    of block copies), repeatedly."""
    had = set(edges_by_src(before))
    while True:
        readers = edges_by_src(pdg)
        dead = {n.id for n in pdg if n.id in had and n.id not in readers and not n.op.effectful}
        if not dead:
            return pdg
        nodes = {k: v for k, v in pdg.nodes.items() if k not in dead}
        edges = tuple(e for e in pdg.edges if e.sink not in dead)
        pdg = pdg.with_(nodes=nodes, edges=edges)

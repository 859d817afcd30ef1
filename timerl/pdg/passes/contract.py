"""Contraction of summed outer products into one matmul (algebraic simplification).

Reverse-mode autodiff of ``x @ w`` gives, at every point, the outer product
``x^T @ g`` of shape ``(k, n)``; the gradient of ``w`` (over fewer dims) then sums these
over the stacked points it reads, ``sum(M[i, 0:T], dims=(0, 1))`` with the batch dim
``b`` vectorized. Materialising ``M`` costs ``B * T * k * n`` elements (2 GB for one
64x64 layer of PPO at 512 envs x 250 steps) where ``X^T @ G`` with ``X`` of shape
``(B * T, k)`` and ``G`` of shape ``(B * T, n)`` gives the same sum with no
intermediate.

Pattern: ``S = SUM(dims=(0, ..., s - 1))`` whose one input reads ``M = MATMUL(X, Y)``
(read by ``S`` alone) with ``s`` stacked axes in front (``M``'s batch dims that ``S``
does not keep as its own batch, plus ``phi``'s slices; a sum kept per batch index, as
when autodiff sums one dim at a time, contracts per batch index); ``X`` and ``Y`` are read by ``M`` at its own point
with ``M``'s batch, with per-point shapes ``(k, 1)`` and ``(1, n)``. Rewrite: ``S``
becomes ``MATMUL(PERMUTE(RESHAPE(X, (-1, k))), RESHAPE(Y, (-1, n)))``, where the two
reshapes read ``X`` and ``Y`` through ``S``'s edge. ``M`` is left for DCE. The reshapes
carry ``contracted_rows=True``: their rows are only summed against rows read the same way,
so trailing zero rows change nothing (a batch axis padded to a bucket of a dynamic bound is
then read with its padding zeroed instead of cut off: ``plan/layout.py``).

A sum kept per batch index is often summed again by its one reader (autodiff sums the
dims of a weight gradient one at a time: over ``t`` per env ``b``, then over ``b``): the
contracted ``MATMUL`` with batch ``(b,)`` followed by ``SUM(dims=(0,))`` over that batch
is one matmul over ``B * T`` rows. :func:`_fold_batch_sums` rewrites it so, reading ``X``
and ``Y`` with the batch dims the outer sum drops stacked in front of the rows (one GEMM
instead of ``B`` small ones and a sum of ``B`` products).

Postcondition: the same values up to float summation order (one matmul instead of a
sum of products); nodes that do not match are unchanged (logged at debug level).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from timerl.pdg.ir import PDG, Edge, Node, TensorSpec, edges_by_src, reads_own_point
from timerl.pdg.ops import Op, OpKind
from timerl.symbolic import TRUE, Expr, Slice, lift

log = logging.getLogger(__name__)


def _static_shape(spec: TensorSpec) -> tuple[int, ...] | None:
    return tuple(spec.shape) if all(isinstance(s, int) for s in spec.shape) else None


def contract_outer_products(pdg: PDG) -> PDG:
    """Rewrite every summed outer product of the pattern (module doc) into one matmul."""
    nodes = dict(pdg.nodes)
    edges = list(pdg.edges)
    readers = edges_by_src(pdg)
    next_id = max(nodes, default=-1) + 1
    done = 0
    for s_node in list(pdg):
        op = s_node.op
        if op.kind is not OpKind.SUM or op.attr("keepdim", False):
            continue
        ins = pdg.data_in_edges(s_node.id)
        if len(ins) != 1:
            continue
        e = ins[0]
        m = pdg.nodes[e.src]
        if m.op.kind is not OpKind.MATMUL or e.select is not None or e.batch_read or e.to_batch is not None:
            continue
        if len(readers.get(m.id, ())) != 1:
            log.debug("contract: %s is read elsewhere; kept", m.label)
            continue
        slices = [c for c in e.phi if isinstance(c, Slice)]
        kept = [d for d in m.batch_dims if d in s_node.batch_dims]
        if kept != list(s_node.batch_dims) or len(m.batch_dims) != len(m.batch):
            continue  # the sum keeps batch dims M does not have (or M's are unnamed)
        summed = [n for d, n in zip(m.batch_dims, m.batch, strict=True) if d not in s_node.batch_dims]
        stacked = len(summed) + len(slices)
        dims = op.attr("dims")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if stacked == 0 or dims != tuple(range(stacked)):
            continue
        m_ins = pdg.data_in_edges(m.id)
        if len(m_ins) != 2:
            continue
        x, y = (pdg.nodes[a.src] for a in m_ins)
        if not all(reads_own_point(a, src, m) for a, src in zip(m_ins, (x, y), strict=True)):
            log.debug("contract: %s reads its operands at other points; kept", m.label)
            continue
        xs = _static_shape(x.outputs[m_ins[0].oid])
        ys = _static_shape(y.outputs[m_ins[1].oid])
        if xs is None or ys is None or len(xs) != 2 or len(ys) != 2 or xs[1] != 1 or ys[0] != 1:
            continue
        k, n = xs[0], ys[1]
        rows: Expr = lift(math.prod(summed))
        for c in slices:
            rows = rows * (c.stop - c.start)
        dt = s_node.outputs[0].dtype
        common = {
            "domain": s_node.domain,
            "cond": s_node.cond,
            "where": s_node.where,
            "batch": s_node.batch,
            "batch_dims": s_node.batch_dims,
        }
        xr, yr, xt = next_id, next_id + 1, next_id + 2
        next_id += 3
        nodes[xr] = Node(
            xr,
            Op.make(OpKind.RESHAPE, shape=(-1, k), contracted_rows=True),
            outputs=(TensorSpec((rows, k), dt),),
            num_inputs=1,
            **common,
        )
        nodes[yr] = Node(
            yr,
            Op.make(OpKind.RESHAPE, shape=(-1, n), contracted_rows=True),
            outputs=(TensorSpec((rows, n), dt),),
            num_inputs=1,
            **common,
        )
        nodes[xt] = Node(
            xt,
            Op.make(OpKind.PERMUTE, dims=(1, 0)),
            outputs=(TensorSpec((k, rows), dt),),
            num_inputs=1,
            **common,
        )
        nodes[s_node.id] = replace(s_node, op=Op.make(OpKind.MATMUL), num_inputs=2)
        here = tuple(s_node.domain)
        edges.remove(e)
        edges += [
            replace(e, sink=xr, src=x.id, iid=0, oid=m_ins[0].oid),
            replace(e, sink=yr, src=y.id, iid=0, oid=m_ins[1].oid),
            Edge(xt, xr, 0, 0, here),
            Edge(s_node.id, xt, 0, 0, here),
            Edge(s_node.id, yr, 1, 0, here),
        ]
        done += 1
    if done:
        log.debug("contract: %d summed outer products became matmuls", done)
    out = pdg.with_(nodes=nodes, edges=tuple(edges))
    return _fold_batch_sums(out) if done else out


def _only_reader(readers: dict[int, list[Edge]], nid: int) -> Edge | None:
    rs = readers.get(nid, [])
    return rs[0] if len(rs) == 1 else None


def _times_rows(spec: TensorSpec, factor: int) -> TensorSpec:
    return replace(spec, shape=(spec.shape[0] * factor,) + tuple(spec.shape[1:]))


def _rows_reshape(node: Node) -> bool:
    """Whether ``node`` is ``RESHAPE(shape=(-1, k))``: every leading axis becomes a row."""
    if node.op.kind is not OpKind.RESHAPE:
        return False
    shape = tuple(node.op.attr("shape"))
    return len(shape) == 2 and shape[0] == -1


def _fold_batch_sums(pdg: PDG) -> PDG:
    """``SUM`` over the batch dims of a contracted matmul (module doc) -> one matmul."""
    nodes = dict(pdg.nodes)
    edges = list(pdg.edges)
    readers = edges_by_src(pdg)
    done = 0
    for s2 in list(pdg):
        if s2.op.kind is not OpKind.SUM or s2.op.attr("keepdim", False):
            continue
        ins = pdg.data_in_edges(s2.id)
        if len(ins) != 1:
            continue
        e2 = ins[0]
        m = pdg.nodes[e2.src]
        if m.op.kind is not OpKind.MATMUL or _only_reader(readers, m.id) is not e2:
            continue
        if e2.cond is not TRUE or e2.select is not None or e2.batch_read or e2.to_batch is not None:
            continue
        if m.domain != s2.domain or not all(c is d for c, d in zip(e2.phi, m.domain, strict=True)):
            continue
        if len(m.batch_dims) != len(m.batch) or len(s2.batch_dims) != len(s2.batch):
            continue
        dropped = [(d, n) for d, n in zip(m.batch_dims, m.batch, strict=True) if d not in s2.batch_dims]
        if not dropped or [d for d in m.batch_dims if d in s2.batch_dims] != list(s2.batch_dims):
            continue
        dims = s2.op.attr("dims")
        dims = (dims,) if isinstance(dims, int) else tuple(dims)
        if dims != tuple(range(len(dropped))):
            continue
        m_ins = pdg.data_in_edges(m.id)
        if len(m_ins) != 2:
            continue
        p, ry = (pdg.nodes[a.src] for a in m_ins)
        if not (p.op.kind is OpKind.PERMUTE and tuple(p.op.attr("dims")) == (1, 0) and _rows_reshape(ry)):
            continue
        p_ins = pdg.data_in_edges(p.id)
        if len(p_ins) != 1 or _only_reader(readers, p.id) is not m_ins[0]:
            continue
        rx = pdg.nodes[p_ins[0].src]
        if not _rows_reshape(rx) or _only_reader(readers, rx.id) is not p_ins[0]:
            continue
        if _only_reader(readers, ry.id) is not m_ins[1]:
            continue
        chain = ((m_ins[0], p, m), (p_ins[0], rx, p), (m_ins[1], ry, m))
        if not all(reads_own_point(a, src, snk) for a, src, snk in chain):
            continue
        ex, ey = pdg.data_in_edges(rx.id), pdg.data_in_edges(ry.id)
        if len(ex) != 1 or len(ey) != 1:
            continue
        ex, ey = ex[0], ey[0]
        x, y = pdg.nodes[ex.src], pdg.nodes[ey.src]
        same_read = (ex.phi, ex.cond, ex.batch_read) == (ey.phi, ey.cond, ey.batch_read)
        if not same_read or ex.select is not None or ey.select is not None:
            continue
        if ex.to_batch is not None or ey.to_batch is not None or x.batch_dims != y.batch_dims:
            continue
        if not all(d in x.batch_dims for d, _ in dropped):
            log.debug("contract: %s sums batch dims its operands lack; kept", s2.label)
            continue
        factor = math.prod(n for _, n in dropped)
        batch = {"batch": s2.batch, "batch_dims": s2.batch_dims}

        nodes[rx.id] = replace(rx, outputs=(_times_rows(rx.outputs[0], factor),), **batch)
        nodes[ry.id] = replace(ry, outputs=(_times_rows(ry.outputs[0], factor),), **batch)
        pspec = p.outputs[0]
        nodes[p.id] = replace(
            p, outputs=(replace(pspec, shape=(pspec.shape[0], pspec.shape[1] * factor)),), **batch
        )
        nodes[s2.id] = replace(s2, op=Op.make(OpKind.MATMUL), num_inputs=2)
        del nodes[m.id]
        edges = [a for a in edges if a.sink != m.id and a is not e2]
        edges += [replace(m_ins[0], sink=s2.id), replace(m_ins[1], sink=s2.id)]
        done += 1
    if done:
        log.debug("contract: %d batch sums of matmuls folded into their matmuls", done)
    return pdg.with_(nodes=nodes, edges=tuple(edges))

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
reshapes read ``X`` and ``Y`` through ``S``'s edge. ``M`` is left for DCE.

Postcondition: the same values up to float summation order (one matmul instead of a
sum of products); nodes that do not match are unchanged (logged at debug level).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

from timerl.pdg.ir import PDG, Edge, Node, TensorSpec, reads_own_point
from timerl.pdg.ops import Op, OpKind
from timerl.symbolic import Expr, Slice, lift

log = logging.getLogger(__name__)


def _static_shape(spec: TensorSpec) -> tuple[int, ...] | None:
    return tuple(spec.shape) if all(isinstance(s, int) for s in spec.shape) else None


def contract_outer_products(pdg: PDG) -> PDG:
    """Rewrite every summed outer product of the pattern (module doc) into one matmul."""
    nodes = dict(pdg.nodes)
    edges = list(pdg.edges)
    readers: dict[int, list[Edge]] = {}
    for e in pdg.edges:
        readers.setdefault(e.src, []).append(e)
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
            Op.make(OpKind.RESHAPE, shape=(-1, k)),
            outputs=(TensorSpec((rows, k), dt),),
            num_inputs=1,
            **common,
        )
        nodes[yr] = Node(
            yr,
            Op.make(OpKind.RESHAPE, shape=(-1, n)),
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
    return pdg.with_(nodes=nodes, edges=tuple(edges))

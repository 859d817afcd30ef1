"""Symbolic reverse-mode autodiff through symbolic dims.

For ``y[p] = f(x[phi(p)])`` the gradient of ``x`` at ``p'`` sums the contributions of
every sink point that read it: ``grad_x[p'] = sum_{p in phi^-1(p')} f'(grad_y[p])``
(TimeRL §5.1). The VJP of each op is written with RT ops (``vjp_rules``), then
:func:`_transpose` moves the contribution from ``y``'s domain to ``x``'s domain by
reading it through the inverted dependence (``timerl.symbolic.invert``) and summing
over the stacked sink points. MERGE gradients flow only to the branch taken.

Parameters (``trl.param``) are leaves: gradients stop there, so a parameter cycle
over ``i`` gives, at each ``i``, the gradient of that iteration's loss with respect to
that iteration's parameters — exactly ``jax.grad`` of the unrolled program step.
Gradient RTs are built lazily, when ``x.grad`` is first read.

A node lacking a dim that encloses one of its own (``i`` before ``t``: ``as_tensor(t) * w``
read at every ``(i, t)``) keeps its gradient over that dim when every reader's gradient
has it (:func:`_gradient_domains`): the sum over ``i`` is deferred to a node that has
``i`` (a sum interchange), because ``T`` may end per ``i`` (a dynamic bound known only at
compile time) and a node over ``t`` alone has no single ``T`` to sum its readers over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from timerl.errors import AutodiffError, NonAffineIndexError
from timerl.pdg.ir import SLICE_VAR, TensorSpec
from timerl.pdg.ops import COMPARISON_OPS, DType, Op, OpKind
from timerl.rt import shapes as S
from timerl.rt.creation import const, zeros
from timerl.rt.graph import BInput, BNode
from timerl.rt.tensor import (
    RecurrentTensor,
    _apply,
    binary,
    materialize,
    softmax,
    where,
)
from timerl.symbolic import (
    TRUE,
    Expr,
    Slice,
    Sym,
    index_symbols,
    invert,
    lift,
    logical_and,
    substitute,
    to_str,
)

RT = RecurrentTensor

NON_DIFF = COMPARISON_OPS | frozenset(
    {
        OpKind.CONST,
        OpKind.EVAL_SYMBOL,
        OpKind.RAND_UNIFORM,
        OpKind.RAND_NORMAL,
        OpKind.SIGN,
        OpKind.ARGMAX,
        OpKind.ARGSORT,
        OpKind.ONE_HOT,
        OpKind.UDF,
        OpKind.SINK,
        OpKind.SET_SYMBOL,
        OpKind.DISCOUNT_WEIGHTS,
    }
)


def register_loss(loss: RT) -> None:
    ctx = loss.ctx
    if loss.ndim != 0:
        raise AutodiffError(
            f"backward() needs a scalar per point; {loss!r} has per-point shape {loss.shape}. "
            "Reduce it first, e.g. loss.mean() or loss.sum()"
        )
    if not loss.dtype.is_float:
        raise AutodiffError(f"backward() needs a float loss, got {loss.dtype.value}")
    if ctx._grads is not None:
        raise AutodiffError(
            "backward() called after gradients were read; call backward() on every loss "
            "(or on their sum) before reading any .grad"
        )
    ctx._seeds.append(loss if loss.is_identity else materialize(loss))


def grad_of(x: RT) -> RT:
    ctx = x.ctx
    if not ctx._seeds:
        raise AutodiffError(f"{x!r}.grad read before any loss.backward()")
    if ctx._grads is None:
        ctx._grads = _build(ctx)
    if not x.is_identity:
        raise AutodiffError(f".grad is defined on RTs, not on indexed views ({x!r})")
    g = ctx._grads.get((x.node.id, x.oid))
    if g is None:
        raise AutodiffError(
            f"{x.node.label} does not influence the loss through differentiable ops, so it has no "
            "gradient (check for detach(), integer casts or comparisons on the path)"
        )
    if set(g.domain) != set(x.node.domain):  # kept over enclosing dims: sum them now
        with ctx:
            g = _sum_over(ctx, g, set(g.domain) - set(x.node.domain))
        ctx._grads[(x.node.id, x.oid)] = g
    return g


def _sum_over(ctx: Any, c: RT, dims: set[Sym]) -> RT:
    """``c`` summed over ``dims``, one at a time, innermost first: a dynamic bound (``T``
    per episode ``i``) is then read at its own enclosing point (``c[i, 0:T]`` summed at
    each ``i``, then ``0:I``); one rectangular read ``c[0:I, 0:T]`` would use a single
    ``T`` for every episode."""
    for q in reversed(ctx.order(dims)):
        if not c.is_identity:
            c = materialize(c)
        c = c[tuple(Slice(lift(0), ctx.bound_of(d)) if d is q else d for d in c.domain)]
        c = c.sum(0)
    return c


def _gradient_domains(ctx: Any, nodes: dict[int, BNode], relevant: set[int]) -> dict[int, tuple[Sym, ...]]:
    """The domain of each relevant node's gradient: its own domain plus the dims ``q`` that
    enclose one of its dims (come before it in the context's order), that every reader's
    gradient has, and that no reader's index mentions (so each reader's point ``q`` maps
    to the gradient's point ``q``). Losses and parameters keep their own domain."""
    pos = {s: k for k, s in enumerate(ctx.index_symbols)}
    readers: dict[int, set[int]] = {nid: set() for nid in relevant}
    mentioned: dict[int, set[Sym]] = {nid: set() for nid in relevant}
    for nid in relevant:
        y = nodes[nid]
        if y.is_param:
            continue
        for k in _diff_inputs(y):
            inp = y.inputs[k]
            if inp.src in relevant:
                readers[inp.src].add(nid)
                for comp in inp.phi:
                    mentioned[inp.src] |= set(index_symbols(comp))
    seeds = {s.node.id for s in ctx._seeds}
    extra: dict[int, set[Sym]] = {}
    for nid in relevant:
        n = nodes[nid]
        if n.is_param or nid in seeds or not readers[nid] or not n.domain:
            extra[nid] = set()
            continue
        last = max(pos[d] for d in n.domain)
        extra[nid] = {q for q in ctx.index_symbols if q not in n.domain and pos[q] < last} - mentioned[nid]
    changed = True
    while changed:
        changed = False
        for nid in relevant:
            keep = {q for q in extra[nid] if all(q in extra[y] or q in nodes[y].domain for y in readers[nid])}
            if keep != extra[nid]:
                extra[nid] = keep
                changed = True
    return {nid: ctx.order(set(nodes[nid].domain) | extra[nid]) for nid in relevant}


# -- relevance -------------------------------------------------------------------------


def _diff_inputs(node: BNode) -> list[int]:
    k = node.op.kind
    if k in NON_DIFF or node.stop_gradient:
        return []
    if k is OpKind.CAST and not node.outputs[0].dtype.is_float:
        return []
    if k is OpKind.WHERE:
        return [1, 2]
    if k in (OpKind.GATHER, OpKind.TAKE, OpKind.INDEX_ADD):
        return [0]
    return list(range(len(node.inputs)))


def _build(ctx: Any) -> dict[tuple[int, int], RT]:
    nodes = ctx.graph.nodes
    # Forward: nodes that depend on a parameter through differentiable inputs.
    needs: set[int] = {n.id for n in nodes.values() if n.is_param}
    changed = True
    while changed:
        changed = False
        for n in list(nodes.values()):
            if n.id in needs or n.is_param:
                continue
            if any(
                n.inputs[k].src in needs and nodes[n.inputs[k].src].outputs[n.inputs[k].oid].dtype.is_float
                for k in _diff_inputs(n)
            ):
                needs.add(n.id)
                changed = True
    # Backward: nodes reachable from the losses (stopping at parameters).
    relevant: set[int] = set()
    stack = [s.node.id for s in ctx._seeds if s.node.id in needs]
    while stack:
        nid = stack.pop()
        if nid in relevant:
            continue
        relevant.add(nid)
        n = nodes[nid]
        if n.is_param:
            continue
        for k in _diff_inputs(n):
            src = n.inputs[k].src
            if src in needs and src not in relevant:
                stack.append(src)
    if not relevant:
        raise AutodiffError("the loss does not depend on any trl.param through differentiable ops")

    # Placeholders for every relevant node's gradient.
    gdom = _gradient_domains(ctx, nodes, relevant)
    gnode: dict[int, BNode] = {}
    for nid in sorted(relevant):
        n = nodes[nid]
        if len(n.outputs) != 1:
            raise AutodiffError(f"cannot differentiate multi-output {n.label}")
        g = ctx.graph.add(
            Op.make(OpKind.IDENTITY),
            gdom[nid],
            (n.outputs[0],),
            cond=n.cond,
            name=f"grad_{n.name}" if n.name else None,
        )
        g.where = n.where
        gnode[nid] = g
    contribs: dict[int, list[RT]] = {nid: [] for nid in relevant}
    for s in ctx._seeds:
        if s.node.id in relevant:
            contribs[s.node.id].append(const(1.0, s.dtype))

    for nid in sorted(relevant):
        y = nodes[nid]
        if y.is_param:
            continue
        gy = RT(ctx, gnode[nid])
        out = RT(ctx, y)
        ins = [_access_rt(ctx, inp, y.cond) for inp in y.inputs]
        for k in _diff_inputs(y):
            inp = y.inputs[k]
            if inp.src not in relevant:
                continue
            c = _vjp(y, k, gy, ins, out)
            x = nodes[inp.src]
            contribs[inp.src].append(_transpose(ctx, c, inp, x, y, gdom[nid], gdom[inp.src]))

    grads: dict[tuple[int, int], RT] = {}
    for nid in sorted(relevant):
        cs = contribs[nid]
        total = cs[0]
        for c in cs[1:]:
            total = total + c
        g = gnode[nid]
        g.inputs.append(BInput(total.node.id, total.oid, total.phi, TRUE))
        grads[(nid, 0)] = RT(ctx, g)
    return grads


def _access_rt(ctx: Any, inp: BInput, cond: Expr = TRUE) -> RT:
    """The RT that ``inp`` reads, in the reader's symbols, under the reader's domain ``cond``.

    The condition matters: a VJP rule that builds ops from the inputs alone (``a ** (b - 1)``
    of POW, ``sign(x)`` of ABS) would otherwise record them over the reader's whole
    unconditioned domain, and a reader such as ``x - x[t - 1, t > 0]`` would make them
    read ``x[-1]``.
    """
    src = ctx.graph.nodes[inp.src]
    extra = []
    for c in inp.phi:
        if isinstance(c, Slice):
            extra.append(S.norm_dim(c.stop - c.start))
    spec = src.outputs[inp.oid]
    return RT(ctx, src, inp.oid, inp.phi, cond, TensorSpec(tuple(extra) + tuple(spec.shape), spec.dtype))


# -- moving a contribution through the inverted dependence -----------------------------


def _transpose(
    ctx: Any, c: RT, inp: BInput, x: BNode, y: BNode, ydom: tuple[Sym, ...], xdom: tuple[Sym, ...]
) -> RT:
    """Contribution ``c`` (over ``y``'s gradient domain ``ydom``, access shape) -> gradient
    part over ``x``'s gradient domain ``xdom`` (``x``'s domain and the enclosing dims kept,
    see :func:`_gradient_domains`)."""
    where_ = f"gradient of {y.label} with respect to input {x.label}"
    if set(c.domain) != set(ydom):
        c = _apply(OpKind.IDENTITY, [c], c.shape, c.dtype, extra_domain=set(ydom))
    if y.cond is not TRUE:
        c = _guard(c, y.cond)
    # How each sink dim q is recovered from a source point.
    inv: dict[Sym, Expr | Slice] = {}
    cond: Expr = TRUE
    select: Expr | None = None
    const_select: Expr | None = None
    # Point components that are no bijection of their sink dim (max(t - 1, 0), t // 2,
    # t % 3, 2 * t): the source point s reads every sink point q (a full slice) and keeps
    # the contributions of the q with comp(q) == s (a mask), i.e. the sum over phi^-1(s).
    masked: dict[Sym, tuple[Sym, Expr]] = {}
    padded: tuple[Sym, Slice] | None = None
    for s, comp in zip(x.domain, inp.phi, strict=True):
        syms = index_symbols(comp)
        if len(syms) > 1:
            raise AutodiffError(f"{where_}: index `{comp}` mixes several dims; not differentiable")
        bound = ctx.bound_of(next(iter(syms))) if syms else None
        try:
            if isinstance(comp, Slice):
                if syms:
                    (q,) = syms
                    if select is not None or padded is not None or q in inv:
                        raise AutodiffError(
                            f"{where_}: at most one symbolic slice per input is differentiable"
                        )
                    try:
                        r = invert(comp, q, bound)
                    except NonAffineIndexError:
                        # bounds that are no shifts (0:t // 2 + 1): pad each sink point's
                        # window to the whole source dim, read every sink point, pick row s
                        inv[q] = Slice(lift(0), bound)
                        padded = (s, comp)
                        continue
                    # source coordinate s <-> sink coordinate q: rename q -> s on the source side
                    inv[q] = substitute(r.index, {q: s}) if q is not s else r.index
                    cond = logical_and(cond, substitute(r.cond, {q: s}))
                    select = s - substitute(comp.start, {q: SLICE_VAR})
                else:
                    cond = logical_and(cond, logical_and(comp.start <= s, s < comp.stop))
                    const_select = s - comp.start
            elif syms:
                (q,) = syms
                if q in inv:
                    raise AutodiffError(f"{where_}: dim `{q}` is used twice in one index")
                try:
                    r = invert(comp, q, bound)
                except NonAffineIndexError:
                    inv[q] = Slice(lift(0), bound)
                    masked[q] = (s, comp)
                    continue
                inv[q] = substitute(r.index, {q: s}) if q is not s else r.index
                cond = logical_and(cond, substitute(r.cond, {q: s}))
            else:
                cond = logical_and(cond, s == comp)
        except NonAffineIndexError as e:
            raise AutodiffError(f"{where_}: {e}") from None
    if padded is not None and (select is not None or const_select is not None):
        raise AutodiffError(f"{where_}: two slices in one input are not differentiable")
    if padded is not None:
        ps, pcomp = padded
        size = ctx.bound_of(ps)
        if not c.is_identity:
            c = materialize(c)
        c = _apply(
            OpKind.PAD_SLICE, [c], (size,) + tuple(c.shape[1:]), c.dtype, dim=0, start=pcomp.start, size=size
        )
    if masked and select is not None:
        raise AutodiffError(
            f"{where_}: a window slice together with the index `{to_str(masked[next(iter(masked))][1])}` "
            "in one read is not differentiable; read the window from a materialized copy "
            "(`(x * 1.0)[...]`) or index with shifts `t + c`"
        )
    if select is not None and const_select is not None:
        raise AutodiffError(f"{where_}: two slices in one input are not differentiable")
    cond = _drop_domain_facts(ctx, cond, x.domain)
    # Sink dims that no index component recovers from a source point: every sink point
    # along them read the same source point, so their contributions are summed. The sum
    # happens here, in sink coordinates and before the gather, because such a dim may
    # share its symbol with a source dim that the input fixes to a constant (the
    # `x[T - 1]` read of `adv[T - 1] = delta[T - 1]`, or `r[0:T]` read at every t): in
    # the gather's domain the two would be one symbol and the read would be wrong.
    # One free dim at a time, innermost first (`_sum_over`). The enclosing dims that
    # ``x``'s gradient keeps are not summed: the gradient reads them at the same point.
    kept = set(xdom) - set(x.domain)
    free = {q for q in ydom if q not in inv and q not in kept}
    if free:
        c = _sum_over(ctx, c, free)
    phi = tuple(inv.get(q, q) for q in c.node.domain)
    n_sl = sum(isinstance(p, Slice) for p in phi)
    shape = tuple(c.shape)
    if select is not None:
        shape = shape[1:]
        if n_sl != 1:
            raise AutodiffError(f"{where_}: unsupported slice pattern")
    extra = [S.norm_dim(p.stop - p.start) for p in phi if isinstance(p, Slice)]
    dom = ctx.order(set(xdom))
    gather_node = ctx.graph.add(
        Op.make(OpKind.IDENTITY),
        dom,
        (TensorSpec(tuple(extra) + shape, c.dtype),),
        [BInput(c.node.id, c.oid, phi, TRUE, select)],
        cond=logical_and(x.cond, cond),
    )
    gather_node.where = y.where
    part = RT(ctx, gather_node)
    if padded is not None:
        part = _apply(
            OpKind.INDEX,
            [part],
            part.shape[:n_sl] + part.shape[n_sl + 1 :],
            part.dtype,
            extra_domain={padded[0]},
            dim=n_sl,
            index=padded[0],
        )
    if masked:
        part = _mask_sink_points(part, [p for p in phi if isinstance(p, Slice)], c.node.domain, phi, masked)
    if n_sl:
        part = part.sum(tuple(range(n_sl)))
    if const_select is not None:
        part = _index0(part, const_select)
    if cond is not TRUE:
        part = _guard(part, cond, x.cond, dom)
    return part


def _mask_sink_points(
    part: RT,
    slices: list[Slice],
    sink_dims: tuple[Sym, ...],
    phi: tuple[Expr | Slice, ...],
    masked: dict[Sym, tuple[Sym, Expr]],
) -> RT:
    """Zero the rows of ``part`` (one leading axis per slice of ``phi``) whose sink point
    ``q`` does not read the source point: ``comp(q) != s`` for each masked sink dim."""
    from timerl.rt.creation import as_tensor

    lead = len(slices)
    pos = 0
    for q, p in zip(sink_dims, phi, strict=True):
        if not isinstance(p, Slice):
            continue
        if q in masked:
            s, comp = masked[q]
            read = as_tensor(comp, DType.int64)[p]  # comp(q) for every sink point q, shape (Q,)
            m = read == as_tensor(s, DType.int64)
            for _ in range(pos):
                m = m.unsqueeze(0)
            for _ in range(part.ndim - pos - 1):
                m = m.unsqueeze(m.ndim)
            part = where(m, part, const(0.0, part.dtype))
        pos += 1
    assert pos == lead
    return part


def _drop_domain_facts(ctx: Any, cond: Expr, domain: tuple[Sym, ...]) -> Expr:
    """Remove conjuncts ``0 <= s`` and ``s < S`` that the domain of ``s`` already implies."""
    from timerl.symbolic import And

    if isinstance(cond, And):
        return logical_and(
            _drop_domain_facts(ctx, cond.args[0], domain), _drop_domain_facts(ctx, cond.args[1], domain)
        )
    for s in domain:
        if cond is (lift(0) <= s) or cond is (s < ctx.bound_of(s)) or cond is (s < ctx.bound_of(s) + 0):
            return TRUE
    return cond


def _index0(part: RT, idx: Expr) -> RT:
    return _apply(
        OpKind.INDEX, [part], part.shape[1:], part.dtype, extra_domain=index_symbols(idx), dim=0, index=idx
    )


def _guard(c: RT, cond: Expr, outer: Expr = TRUE, dom: tuple[Sym, ...] | None = None) -> RT:
    """``c`` where ``cond`` holds, zeros elsewhere (a MERGE, so nothing is read outside)."""
    ctx = c.ctx
    dom = dom if dom is not None else c.domain
    z = zeros(tuple(c.shape) if all(isinstance(d, int) for d in c.shape) else (), c.dtype)
    if z.shape != c.shape:
        z = z.expand(c.shape)
    m = ctx.graph.add(Op.make(OpKind.MERGE), ctx.order(set(dom)), (c.spec,), cond=outer)
    m.inputs.append(BInput(c.node.id, c.oid, c.phi, cond))
    m.inputs.append(BInput(z.node.id, z.oid, z.phi, TRUE))
    return RT(ctx, m)


# -- VJP rules ------------------------------------------------------------------------


def _unbroadcast(g: RT, shape: tuple[Any, ...]) -> RT:
    """Sum ``g`` down to ``shape`` (the reverse of NumPy broadcasting)."""
    if tuple(g.shape) == tuple(shape):
        return g
    lead = g.ndim - len(shape)
    if lead > 0:
        g = g.sum(tuple(range(lead)))
    dims = tuple(k for k, d in enumerate(shape) if d == 1 and not isinstance(d, Expr) and g.shape[k] != 1)
    if dims:
        g = g.sum(dims, keepdim=True)
    return g


def _f(x: RT, v: float) -> RT:
    return const(v, x.dtype)


VJPRule = Callable[[int, RT, list[RT], RT, BNode], RT]


def _vjp(y: BNode, k: int, g: RT, ins: list[RT], out: RT) -> RT:
    rule = vjp_rules.get(y.op.kind)
    if rule is None:
        raise AutodiffError(f"no gradient rule for {y.op.kind.name} ({y.label})")
    c = rule(k, g, ins, out, y)
    want = ins[k].shape
    if tuple(c.shape) != tuple(want):
        c = _unbroadcast(c, tuple(want))
    if c.dtype is not ins[k].dtype:
        c = c.cast(ins[k].dtype)
    return c


def _attr(y: BNode, name: str) -> Any:
    return y.op.attr(name)


def _merge_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    return _guard(g, y.inputs[k].cond)


def _sum_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    x = ins[0]
    dims = _attr(y, "dims")
    if not _attr(y, "keepdim"):
        for d in dims:
            g = g.unsqueeze(d)
    return g.expand(x.shape)


def _minmax_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    x = ins[0]
    dims = _attr(y, "dims")
    o = out
    if not _attr(y, "keepdim"):
        for d in dims:
            g = g.unsqueeze(d)
            o = o.unsqueeze(d)
    mask = (x == o).cast(x.dtype)
    count = mask.sum(dims, keepdim=True)
    return g * mask / count


def _matmul_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    a, b = ins
    if k == 0 and a.ndim == 1 and b.ndim == 2:  # vector @ matrix: g @ b^T, one GEMM over a batch
        return g @ _mT(b)
    if k == 1 and b.ndim == 1 and a.ndim == 2:
        return _mT(a) @ g
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(1) if b.ndim == 1 else b
    g2 = g
    if b.ndim == 1:
        g2 = g2.unsqueeze(g2.ndim)
    if a.ndim == 1:
        g2 = g2.unsqueeze(g2.ndim - 1)
    if k == 0:
        r = g2 @ _mT(b2)
        return r.squeeze(r.ndim - 2) if a.ndim == 1 else r
    r = _mT(a2) @ g2
    return r.squeeze(r.ndim - 1) if b.ndim == 1 else r


def _mT(x: RT) -> RT:
    perm = list(range(x.ndim))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    return x.permute(*perm)


def _discounted_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    x = ins[0]
    return _apply(OpKind.DISCOUNT_WEIGHTS, [g, x], x.shape, x.dtype, gamma=_attr(y, "gamma"))


def _cumsum_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    d = _attr(y, "dim")
    return g.sum(d, keepdim=True) - g.cumsum(d) + g


def _log_softmax_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    d = _attr(y, "dim")
    return g - softmax(ins[0], d) * g.sum(d, keepdim=True)


def _softmax_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    d = _attr(y, "dim")
    return out * (g - (g * out).sum(d, keepdim=True))


def _reshape_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    return g.reshape(tuple(ins[0].shape))


def _permute_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    dims = _attr(y, "dims")
    inv = [0] * len(dims)
    for a, b in enumerate(dims):
        inv[b] = a
    return g.permute(*inv)


def _slice_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    x = ins[0]
    d = _attr(y, "dim")
    return _apply(
        OpKind.PAD_SLICE, [g], x.shape, g.dtype, dim=d, start=_attr(y, "start"), size=lift(x.shape[d])
    )


def _index_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    x = ins[0]
    d = _attr(y, "dim")
    idx = _attr(y, "index")
    return _apply(
        OpKind.PAD_SLICE,
        [g.unsqueeze(d)],
        x.shape,
        g.dtype,
        extra_domain=index_symbols(idx),
        dim=d,
        start=idx,
        size=lift(x.shape[d]),
    )


def _cat_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    d = _attr(y, "dim")
    start: Any = lift(0)
    for x in ins[:k]:
        start = start + lift(x.shape[d])
    stop = start + lift(ins[k].shape[d])
    return _apply(OpKind.SLICE, [g], ins[k].shape, g.dtype, dim=d, start=start, stop=stop)


def _stack_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    d = _attr(y, "dim")
    return _apply(OpKind.INDEX, [g], ins[k].shape, g.dtype, dim=d, index=lift(k))


def _gather_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    x, idx = ins
    n = x.shape[-1]
    oh = _apply(OpKind.ONE_HOT, [idx], tuple(idx.shape) + (n,), x.dtype, num_classes=n, dtype=x.dtype)
    return oh * g.unsqueeze(g.ndim)


def _take_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    x, idx = ins
    return _apply(OpKind.INDEX_ADD, [g, idx], x.shape, g.dtype, size=x.shape[0])


def _index_add_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    rows, idx = ins
    return _apply(OpKind.TAKE, [g, idx], rows.shape, g.dtype)


def _where_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    c = ins[0]
    z = zeros((), g.dtype)
    return where(c, g, z) if k == 1 else where(c, z, g)


def _cast_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    return g.cast(ins[0].dtype)


def _pow_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    a, b = ins
    if k == 0:
        return g * b * binary(OpKind.POW, a, b - _f(b, 1.0))
    return g * out * a.log()


def _tanh_grad_rule(k: int, g: RT, ins: list[RT], out: RT, y: BNode) -> RT:
    h, t = ins  # out = h * (1 - t * t)
    if k == 0:
        return binary(OpKind.TANH_GRAD, g, t)
    return g * h * t * _f(g, -2.0)


vjp_rules: dict[OpKind, VJPRule] = {
    OpKind.MERGE: _merge_rule,
    OpKind.IDENTITY: lambda k, g, ins, out, y: g,
    OpKind.NEG: lambda k, g, ins, out, y: -g,
    OpKind.ADD: lambda k, g, ins, out, y: g,
    OpKind.SUB: lambda k, g, ins, out, y: g if k == 0 else -g,
    OpKind.MUL: lambda k, g, ins, out, y: g * ins[1 - k],
    OpKind.DIV: lambda k, g, ins, out, y: g / ins[1] if k == 0 else -g * ins[0] / (ins[1] * ins[1]),
    OpKind.POW: _pow_rule,
    OpKind.MAXIMUM: lambda k, g, ins, out, y: where(
        ins[0] >= ins[1] if k == 0 else ins[1] > ins[0], g, _f(g, 0.0)
    ),
    OpKind.MINIMUM: lambda k, g, ins, out, y: where(
        ins[0] <= ins[1] if k == 0 else ins[1] < ins[0], g, _f(g, 0.0)
    ),
    OpKind.EXP: lambda k, g, ins, out, y: g * out,
    OpKind.LOG: lambda k, g, ins, out, y: g / ins[0],
    OpKind.SQRT: lambda k, g, ins, out, y: g * _f(g, 0.5) / out,
    OpKind.TANH: lambda k, g, ins, out, y: binary(OpKind.TANH_GRAD, g, out),
    OpKind.TANH_GRAD: _tanh_grad_rule,
    OpKind.ABS: lambda k, g, ins, out, y: g * _apply(OpKind.SIGN, [ins[0]], ins[0].shape, ins[0].dtype),
    OpKind.RELU: lambda k, g, ins, out, y: g * (ins[0] > _f(ins[0], 0.0)).cast(g.dtype),
    OpKind.SIGMOID: lambda k, g, ins, out, y: g * out * (_f(g, 1.0) - out),
    OpKind.CAST: _cast_rule,
    OpKind.WHERE: _where_rule,
    OpKind.SUM: _sum_rule,
    OpKind.MAX: _minmax_rule,
    OpKind.MIN: _minmax_rule,
    OpKind.MATMUL: _matmul_rule,
    OpKind.CUMSUM: _cumsum_rule,
    OpKind.DISCOUNTED_SUM: _discounted_rule,
    OpKind.LOG_SOFTMAX: _log_softmax_rule,
    OpKind.SOFTMAX: _softmax_rule,
    OpKind.RESHAPE: _reshape_rule,
    OpKind.PERMUTE: _permute_rule,
    OpKind.EXPAND: lambda k, g, ins, out, y: _unbroadcast(g, tuple(ins[0].shape)),
    OpKind.SQUEEZE: lambda k, g, ins, out, y: g.unsqueeze(_attr(y, "dim")),
    OpKind.UNSQUEEZE: lambda k, g, ins, out, y: g.squeeze(_attr(y, "dim")),
    OpKind.SLICE: _slice_rule,
    OpKind.INDEX: _index_rule,
    OpKind.CAT: _cat_rule,
    OpKind.STACK: _stack_rule,
    OpKind.GATHER: _gather_rule,
    OpKind.TAKE: _take_rule,
    OpKind.INDEX_ADD: _index_add_rule,
}

__all__ = ["register_loss", "grad_of", "vjp_rules", "DType"]

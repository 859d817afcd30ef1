"""Recurrent tensors: the user-facing handle on a node output read through an index.

A :class:`RecurrentTensor` is ``(node, oid)`` read at ``phi`` (one index component
per node-domain dim, in the RT's own symbols) when ``cond``. A freshly built RT has
the identity ``phi``; indexing (``x[t + 1]``, ``r[t:T]``, ``x[(i + 1) % 10 == 0]``)
returns a new RT over the same node with another ``phi``. Ops on RTs record nodes
whose inputs are exactly these accesses, so every dependence lands on a PDG edge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from timerl.errors import NonAffineIndexError, RTDefinitionError, ShapeError
from timerl.pdg.ir import ShapeDim, TensorSpec
from timerl.pdg.ops import DType, Op, OpKind
from timerl.rt import shapes as S
from timerl.rt.context import Context, current
from timerl.rt.graph import BInput, BNode
from timerl.symbolic import (
    TRUE,
    Const,
    Expr,
    FloorDiv,
    Mod,
    Mul,
    Slice,
    Sym,
    index_symbols,
    is_bool,
    lift,
    logical_and,
    logical_not,
    same,
    substitute,
    to_str,
)
from timerl.symbolic.simplify import affine_in

Index = Expr | Slice


class RecurrentTensor:
    """A tensor that varies over symbolic dims (its *domain*) with a per-point shape."""

    __slots__ = ("ctx", "node", "oid", "phi", "cond", "domain", "spec")
    __array_priority__ = 1000  # numpy scalars defer to our operators

    def __init__(
        self,
        ctx: Context,
        node: BNode,
        oid: int = 0,
        phi: tuple[Index, ...] | None = None,
        cond: Expr | None = None,
        spec: TensorSpec | None = None,
    ) -> None:
        self.ctx = ctx
        self.node = node
        self.oid = oid
        self.phi = tuple(node.domain) if phi is None else phi
        self.cond = node.cond if cond is None else cond
        syms: set[Sym] = set()
        for c in self.phi:
            syms |= index_symbols(c)
        syms |= index_symbols(self.cond)
        self.domain = ctx.order(syms)
        self.spec = node.outputs[oid] if spec is None else spec

    # -- basic properties -----------------------------------------------------------
    @property
    def shape(self) -> tuple[ShapeDim, ...]:
        return self.spec.shape

    @property
    def dtype(self) -> DType:
        return self.spec.dtype

    @property
    def ndim(self) -> int:
        return len(self.spec.shape)

    @property
    def name(self) -> str | None:
        return self.node.name

    @property
    def is_identity(self) -> bool:
        return all(p is s for p, s in zip(self.phi, self.node.domain, strict=True)) and len(self.phi) == len(
            self.node.domain
        )

    def _input(self) -> BInput:
        return BInput(self.node.id, self.oid, self.phi)

    def __repr__(self) -> str:
        idx = ", ".join(map(str, self.phi))
        nm = f" '{self.name}'" if self.name else ""
        return (
            f"RecurrentTensor{nm}(%{self.node.id}[{idx}], domain=({', '.join(s.name for s in self.domain)}), "
            f"shape={self.shape}, dtype={self.dtype.value})"
        )

    def __bool__(self) -> bool:
        raise RTDefinitionError(
            "a recurrent tensor has no truth value at trace time; use trl.where(...) or a "
            "symbolic condition index x[cond] instead of a Python `if`"
        )

    def __iter__(self):
        raise RTDefinitionError("recurrent tensors cannot be iterated; index them or use ops")

    def __len__(self) -> int:
        d = self.shape[0] if self.shape else None
        if not isinstance(d, int):
            raise RTDefinitionError(f"len() of {self!r}: leading size is not a concrete int")
        return d

    # -- indexing -------------------------------------------------------------------
    def __getitem__(self, idx: Any) -> RecurrentTensor:
        if not isinstance(idx, tuple):
            idx = (idx,)
        conds: list[Expr] = []
        sym_entries: list[Index] = []
        concrete: list[Any] = []
        n = len(self.domain)
        for e in idx:
            if isinstance(e, Expr) and is_bool(e):
                conds.append(e)
            elif e is Ellipsis:
                raise RTDefinitionError("`...` is not supported in recurrent-tensor indices")
            elif len(sym_entries) < n and not concrete:
                sym_entries.append(_to_index(e, self, len(sym_entries)))
            else:
                concrete.append(e)
        for d, e in zip(self.domain, sym_entries, strict=False):
            _check_affine(self, e, f"on dim `{d}`")
        for c in conds:
            _check_affine(self, c, "in the condition")
        out = self
        if sym_entries or conds:
            out = self._reindex(sym_entries, conds)
        for dim, kind, value in _concrete_plan(concrete):
            out = out._index_concrete(dim, kind, value)
        return out

    def _reindex(self, entries: list[Index], conds: list[Expr]) -> RecurrentTensor:
        entries = entries + list(self.domain[len(entries) :])
        if any(isinstance(c, Slice) for c in self.phi) and not all(
            isinstance(e, Sym) and e is s for e, s in zip(entries, self.domain, strict=True)
        ):
            return materialize(self)._reindex(entries, conds)
        mapping: dict[Sym, Any] = {}
        extra: list[ShapeDim] = []
        for s, e in zip(self.domain, entries, strict=True):
            if isinstance(e, Slice):
                mapping[s] = e
                extra.append(S.norm_dim(e.stop - e.start))
            else:
                mapping[s] = e
        new_phi: list[Index] = []
        for c in self.phi:
            if isinstance(c, Slice):
                new_phi.append(substitute(c, {k: v for k, v in mapping.items() if not isinstance(v, Slice)}))
                continue
            syms = index_symbols(c)
            sl = [s for s in syms if isinstance(mapping.get(s), Slice)]
            if sl:
                if (
                    len(syms) != 1
                    or not isinstance(affine_in(c, sl[0]), tuple)
                    or affine_in(c, sl[0])[0] != 1
                ):
                    # The view's index is not a shift (`x[max(t - 2, 0)]`, `x[t // 2]`), so a
                    # slice of the view is no slice of the source: give the view its own node.
                    return materialize(self)._reindex(entries, conds)
                sli = mapping[sl[0]]
                new_phi.append(Slice(substitute(c, {sl[0]: sli.start}), substitute(c, {sl[0]: sli.stop})))
            else:
                new_phi.append(substitute(c, mapping))
        point_map = {k: v for k, v in mapping.items() if not isinstance(v, Slice)}
        cond = (
            substitute(self.cond, point_map)
            if all(not isinstance(v, Slice) for v in mapping.values())
            else self.cond
        )
        for c in conds:
            cond = logical_and(cond, c)
        spec = TensorSpec(tuple(extra) + tuple(self.shape), self.dtype)
        return RecurrentTensor(self.ctx, self.node, self.oid, tuple(new_phi), cond, spec)

    def _index_concrete(self, dim: int, kind: str, value: Any) -> RecurrentTensor:
        if dim >= self.ndim:
            raise ShapeError(f"too many indices for {self!r} (per-point shape {self.shape})")
        if kind == "index":
            value = lift(value)
            size = self.shape[dim]
            if isinstance(value, Const) and isinstance(size, int) and value.value < 0:
                value = lift(value.value + size)
            shape = self.shape[:dim] + self.shape[dim + 1 :]
            return _apply(
                OpKind.INDEX,
                [self],
                shape,
                self.dtype,
                extra_domain=index_symbols(value),
                dim=dim,
                index=value,
            )
        start, stop = _fix_slice_bounds(self, dim, value)
        size = S.norm_dim(lift(stop) - lift(start))
        shape = self.shape[:dim] + (size,) + self.shape[dim + 1 :]
        return _apply(OpKind.SLICE, [self], shape, self.dtype, dim=dim, start=lift(start), stop=lift(stop))

    def __setitem__(self, idx: Any, value: Any) -> None:
        define_branch(self, idx, value)

    # -- arithmetic -------------------------------------------------------------------
    def __add__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.ADD, self, o)

    def __radd__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.ADD, o, self)

    def __sub__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.SUB, self, o)

    def __rsub__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.SUB, o, self)

    def __mul__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.MUL, self, o)

    def __rmul__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.MUL, o, self)

    def __truediv__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.DIV, self, o)

    def __rtruediv__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.DIV, o, self)

    def __pow__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.POW, self, o)

    def __rpow__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.POW, o, self)

    def __neg__(self) -> RecurrentTensor:
        return unary(OpKind.NEG, self)

    def __matmul__(self, o: Any) -> RecurrentTensor:
        return matmul(self, o)

    def __rmatmul__(self, o: Any) -> RecurrentTensor:
        return matmul(o, self)

    def __lt__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.LT, self, o)

    def __le__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.LE, self, o)

    def __gt__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.GT, self, o)

    def __ge__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.GE, self, o)

    def __eq__(self, o: Any) -> RecurrentTensor:  # type: ignore[override]
        return binary(OpKind.EQ, self, o)

    def __ne__(self, o: Any) -> RecurrentTensor:  # type: ignore[override]
        return binary(OpKind.NE, self, o)

    __hash__ = object.__hash__

    def __and__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.LOGICAL_AND, self, o)

    def __or__(self, o: Any) -> RecurrentTensor:
        return binary(OpKind.LOGICAL_OR, self, o)

    def __invert__(self) -> RecurrentTensor:
        return unary(OpKind.LOGICAL_NOT, self)

    # -- elementwise ------------------------------------------------------------------
    def exp(self) -> RecurrentTensor:
        return unary(OpKind.EXP, self)

    def log(self) -> RecurrentTensor:
        return unary(OpKind.LOG, self)

    def sqrt(self) -> RecurrentTensor:
        return unary(OpKind.SQRT, self)

    def tanh(self) -> RecurrentTensor:
        return unary(OpKind.TANH, self)

    def abs(self) -> RecurrentTensor:
        return unary(OpKind.ABS, self)

    def relu(self) -> RecurrentTensor:
        return unary(OpKind.RELU, self)

    def sigmoid(self) -> RecurrentTensor:
        return unary(OpKind.SIGMOID, self)

    def cast(self, dtype: DType) -> RecurrentTensor:
        if dtype is self.dtype:
            return self
        return _apply(OpKind.CAST, [self], self.shape, dtype, dtype=dtype)

    def detach(self) -> RecurrentTensor:
        out = _apply(OpKind.IDENTITY, [self], self.shape, self.dtype)
        out.node.stop_gradient = True
        return out

    def where(self, cond: Any, other: Any) -> RecurrentTensor:
        """``self`` where ``cond`` holds, else ``other``."""
        return where(cond, self, other)

    # -- reductions ---------------------------------------------------------------------
    def _dims(self, dim: int | Sequence[int] | None) -> tuple[int, ...]:
        if dim is None:
            return tuple(range(self.ndim))
        if isinstance(dim, int):
            dim = (dim,)
        return tuple(sorted({S.norm_axis(d, self.ndim, "reduction") for d in dim}))

    def _reduce(self, kind: OpKind, dim: Any, keepdim: bool) -> RecurrentTensor:
        dims = self._dims(dim)
        if keepdim:
            shape = tuple(1 if k in dims else d for k, d in enumerate(self.shape))
        else:
            shape = tuple(d for k, d in enumerate(self.shape) if k not in dims)
        return _apply(kind, [self], shape, self.dtype, dims=dims, keepdim=keepdim)

    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Sum over concrete (per-point) dims; all of them by default."""
        return self._reduce(OpKind.SUM, dim, keepdim)

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        """Mean over concrete (per-point) dims; all of them by default."""
        dims = self._dims(dim)
        count = S.numel([self.shape[d] for d in dims])
        s = self._reduce(OpKind.SUM, dim, keepdim)
        if isinstance(count, Expr):
            return s / as_float(count)
        return s / float(count) if count != 1 else s

    def max(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        return self._reduce(OpKind.MAX, dim, keepdim)

    def min(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> RecurrentTensor:
        return self._reduce(OpKind.MIN, dim, keepdim)

    def argmax(self, dim: int = -1) -> RecurrentTensor:
        d = S.norm_axis(dim, self.ndim, "argmax")
        shape = self.shape[:d] + self.shape[d + 1 :]
        return _apply(OpKind.ARGMAX, [self], shape, DType.int64, dim=d)

    def argsort(self, dim: int = -1) -> RecurrentTensor:
        """Indices (int64) that sort the per-point values along ``dim``, ascending and stable."""
        d = S.norm_axis(dim, self.ndim, "argsort")
        return _apply(OpKind.ARGSORT, [self], self.shape, DType.int64, dim=d)

    def take(self, index: Any) -> RecurrentTensor:
        """Rows ``self[index]`` along the leading per-point dim, ``index`` an int RT of per-point
        shape ``(k,)`` (e.g. a minibatch of a flattened rollout: ``obs.take(perm[0:64])``).
        Differentiable in ``self`` (the gradient adds each taken row back at its index)."""
        from timerl.rt.creation import const

        idx = index if isinstance(index, RecurrentTensor) else const(np.asarray(index, dtype=np.int64))
        if self.ndim == 0:
            raise ShapeError(f"take on {self!r}: it has no per-point dim to take rows of")
        if idx.ndim != 1 or idx.dtype.is_float or idx.dtype is DType.bool_:
            raise ShapeError(
                f"take on {self!r}: the index must be a 1-D int RT per point, got {idx!r} "
                f"(shape {idx.shape}, {idx.dtype.value}); cast it with .cast(trl.int64)"
            )
        return _apply(OpKind.TAKE, [self, idx], (idx.shape[0], *self.shape[1:]), self.dtype)

    def cumsum(self, dim: int = 0) -> RecurrentTensor:
        d = S.norm_axis(dim, self.ndim, "cumsum")
        return _apply(OpKind.CUMSUM, [self], self.shape, self.dtype, dim=d)

    def discounted_sum(self, gamma: float) -> RecurrentTensor:
        """``sum_k gamma**k * x[k]`` over the leading per-point dim (a slice's dim); integer and
        boolean tensors are summed as float32 (the weights are fractions)."""
        if self.ndim == 0:
            raise ShapeError(
                f"discounted_sum needs a leading dim to sum over; {self!r} is a scalar per point. "
                "Index it with a slice first, e.g. r[t:T].discounted_sum(0.99)"
            )
        x = self if self.dtype.is_float else self.cast(DType.float32)
        return _apply(OpKind.DISCOUNTED_SUM, [x], x.shape[1:], x.dtype, gamma=float(gamma))

    def softmax(self, dim: int = -1) -> RecurrentTensor:
        return softmax(self, dim)

    def log_softmax(self, dim: int = -1) -> RecurrentTensor:
        return log_softmax(self, dim)

    # -- layout -------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> RecurrentTensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = tuple(S.norm_dim(d) for d in shape)
        if any(isinstance(d, Expr) for d in (*self.shape, *shape)):
            shape = _symbolic_reshape(self, shape)
        else:
            total = S.numel(self.shape)
            if shape.count(-1) == 1:
                known = int(np.prod([d for d in shape if d != -1]))
                shape = tuple(total // known if d == -1 else d for d in shape)
            if int(np.prod(shape)) != total:
                raise ShapeError(f"cannot reshape per-point shape {self.shape} into {shape}")
        return _apply(OpKind.RESHAPE, [self], shape, self.dtype, shape=shape)

    def permute(self, *dims: int) -> RecurrentTensor:
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        dims = tuple(S.norm_axis(d, self.ndim, "permute") for d in dims)
        if sorted(dims) != list(range(self.ndim)):
            raise ShapeError(f"permute dims {dims} are not a permutation of {self.ndim} dims")
        return _apply(OpKind.PERMUTE, [self], tuple(self.shape[d] for d in dims), self.dtype, dims=dims)

    def squeeze(self, dim: int) -> RecurrentTensor:
        d = S.norm_axis(dim, self.ndim, "squeeze")
        if self.shape[d] != 1:
            raise ShapeError(f"squeeze({dim}) of per-point shape {self.shape}: size is not 1")
        return _apply(OpKind.SQUEEZE, [self], self.shape[:d] + self.shape[d + 1 :], self.dtype, dim=d)

    def unsqueeze(self, dim: int) -> RecurrentTensor:
        d = S.norm_axis(dim, self.ndim + 1, "unsqueeze")
        return _apply(OpKind.UNSQUEEZE, [self], self.shape[:d] + (1,) + self.shape[d:], self.dtype, dim=d)

    def expand(self, *shape: Any) -> RecurrentTensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        target = S.norm_shape(shape)
        S.broadcast([self.shape, target], f"expand of {self.node.label} to {target}")
        return _apply(OpKind.EXPAND, [self], target, self.dtype, shape=target)

    # -- effects --------------------------------------------------------------------------
    def sink(self, fn: Callable[[np.ndarray, dict[str, int]], Any], name: str | None = None) -> None:
        """Call ``fn(host_value, point)`` at every point of this RT's domain at runtime."""
        node = self.ctx.graph.add(
            Op.make(OpKind.SINK, fn=fn), self.domain, (), [self._input()], cond=self.cond, name=name
        )
        del node

    def checkpoint(self, path: str, config: dict[str, Any] | None = None) -> None:
        """Checkpoint the program into ``path`` at the end of every iteration where this RT runs.

        Writes ``<path>/ckpt_<i>.npz`` (all values carried into the next iteration: params,
        optimiser state, any recurrence over ``i``), ``<path>/ckpt_<i>.json`` (iteration,
        program fingerprint, ``config``) and, where the program steps gymnasium or gymnax
        envs, ``<path>/ckpt_<i>.envs.pkl`` (their states); ``ctx.compile(..., resume=path)``
        continues from it.
        """
        from timerl.rt.checkpoint import save_sink

        self.sink(save_sink(path, self.name or f"rt{self.node.id}", config))

    def backward(self) -> None:
        """Accumulate gradients of this scalar-per-point RT over all its points."""
        from timerl.rt.autodiff import register_loss

        register_loss(self)

    @property
    def grad(self) -> RecurrentTensor:
        """Gradient of the registered losses with respect to this RT (same domain and shape)."""
        from timerl.rt.autodiff import grad_of

        return grad_of(self)


RT = RecurrentTensor


# -- construction helpers ---------------------------------------------------------------


def _symbolic_reshape(x: RecurrentTensor, shape: tuple[ShapeDim, ...]) -> tuple[ShapeDim, ...]:
    """The target of a reshape with symbolic dims (``(B, T, 4) -> (-1, 4)`` or ``(B * T, 4)``):
    each symbolic target dim must be a source dim or a product of source dims, the ints must
    divide what is left, and at most one ``-1`` takes the rest."""
    if shape.count(-1) > 1:
        raise ShapeError(f"reshape of {x!r}: at most one -1 in {shape}")
    left_sym = [d for d in x.shape if isinstance(d, Expr)]
    left_int = int(np.prod([d for d in x.shape if not isinstance(d, Expr)]))

    def take_factor(e: Expr) -> bool:
        for k, d in enumerate(left_sym):
            if same(d, e):
                del left_sym[k]
                return True
        return False

    want_int = 1
    for d in shape:
        if d == -1 or not isinstance(d, Expr):
            want_int *= 1 if d == -1 else int(d)
            continue
        factors = _product_factors(d)
        if not all(take_factor(f) if isinstance(f, Expr) else True for f in factors):
            raise ShapeError(
                f"reshape of {x!r}: target dim {to_str(d)} is not a product of the per-point dims {x.shape}"
            )
        want_int *= int(np.prod([f for f in factors if not isinstance(f, Expr)]))
    if left_int % want_int:
        raise ShapeError(f"cannot reshape per-point shape {x.shape} into {shape}")
    rest: ShapeDim = left_int // want_int
    for d in left_sym:
        rest = S.norm_dim(lift(rest) * d)
    if -1 in shape:
        return tuple(rest if d == -1 else d for d in shape)
    if rest != 1:
        raise ShapeError(f"cannot reshape per-point shape {x.shape} into {shape}: {rest} elements left over")
    return shape


def _product_factors(e: Expr) -> list[Expr | int]:
    """``e`` as a list of factors when it is a product of symbols and constants."""
    if isinstance(e, Const):
        return [int(e.value)]
    if isinstance(e, Mul):
        return [f for a in e.args for f in _product_factors(a)]
    return [e]


def _to_index(e: Any, x: RecurrentTensor, pos: int) -> Index:
    if isinstance(e, slice):
        if e.step not in (None, 1):
            raise RTDefinitionError(f"slices with a step are not supported (got step {e.step})")
        start = lift(0 if e.start is None else e.start)
        stop = lift(x.ctx.bound_of(x.domain[pos]) if e.stop is None else e.stop)
        return Slice(start, stop)
    if isinstance(e, (Expr, int, np.integer)):
        return lift(e)
    if isinstance(e, Slice):
        return e
    if isinstance(e, RecurrentTensor):
        raise RTDefinitionError(
            "indexing a symbolic dim with a recurrent tensor is not supported; "
            "use a symbolic expression (e.g. t + 1) or trl.where"
        )
    raise RTDefinitionError(f"bad index {e!r} for {x!r}")


def _non_affine_part(e: Index) -> tuple[Expr, str] | None:
    """The first sub-expression of ``e`` that no Presburger relation can express, with why.

    Bounds (``T``) count as constants here: ``t * T`` is affine once ``T`` gets a static
    value, and the scheduler reports it if ``T`` stays symbolic.
    """
    if isinstance(e, Slice):
        return _non_affine_part(e.start) or _non_affine_part(e.stop)
    if not isinstance(e, Expr) or not e.args or isinstance(e, Const):
        return None
    a = e.args
    if isinstance(e, Mul) and index_symbols(a[0]) and index_symbols(a[1]):
        return e, "multiplies two index symbols"
    if isinstance(e, (FloorDiv, Mod)) and index_symbols(a[1]):
        return e, f"uses `{'//' if isinstance(e, FloorDiv) else '%'}` by an index symbol"
    for sub in a:
        if isinstance(sub, (Expr, Slice)):
            bad = _non_affine_part(sub)
            if bad is not None:
                return bad
    return None


_AFFINE_HINT = (
    "index symbolic dims with affine expressions of the dims, such as t + 1, 2 * t, t // 2, "
    "T - 1 - t or trl.min(t + n, T)"
)


def _check_affine(x: RecurrentTensor, e: Index, where: str, hint: str = _AFFINE_HINT) -> None:
    """Reject a non-affine index or condition of ``x`` where it is written."""
    bad = _non_affine_part(e)
    if bad is None:
        return
    part, why = bad
    raise NonAffineIndexError(
        f"index `{to_str(e)}` {where} of {x.node.label} is not affine: `{to_str(part)}` {why}, so "
        f"the dependence cannot become a polyhedral relation. Hint: {hint}"
    )


def _concrete_plan(entries: list[Any]) -> list[tuple[int, str, Any]]:
    plan: list[tuple[int, str, Any]] = []
    dim = 0
    for e in entries:
        if isinstance(e, slice):
            if e.step not in (None, 1):
                raise RTDefinitionError("slices with a step are not supported")
            plan.append((dim, "slice", (e.start, e.stop)))
            dim += 1
        elif isinstance(e, (int, np.integer, Expr)):
            plan.append((dim, "index", e))
        else:
            raise RTDefinitionError(f"bad concrete index {e!r}")
    return plan


def _fix_slice_bounds(x: RecurrentTensor, dim: int, value: tuple[Any, Any]) -> tuple[Any, Any]:
    start, stop = value
    size = x.shape[dim]
    start = 0 if start is None else start
    stop = size if stop is None else stop
    if isinstance(start, int) and start < 0 and isinstance(size, int):
        start += size
    if isinstance(stop, int) and stop < 0 and isinstance(size, int):
        stop += size
    return start, stop


def _apply(
    kind: OpKind,
    operands: Sequence[RecurrentTensor],
    out_shape: Sequence[ShapeDim],
    out_dtype: DType,
    extra_domain: frozenset[Sym] | set[Sym] = frozenset(),
    name: str | None = None,
    **attrs: Any,
) -> RecurrentTensor:
    """Record a node of ``kind`` reading ``operands``; its domain is their union and the dims
    its output shape uses (zeros expanded to a window's ``T - t - 1`` rows vary with ``t``)."""
    ctx = operands[0].ctx if operands else current()
    syms: set[Sym] = set(extra_domain)
    cond: Expr = TRUE
    for o in operands:
        syms |= set(o.domain)
        cond = logical_and(cond, o.cond)
    for d in out_shape:
        if isinstance(d, Expr):
            syms |= index_symbols(d)
    domain = ctx.order(syms)
    node = ctx.graph.add(
        Op.make(kind, **attrs),
        domain,
        (TensorSpec(S.norm_shape(out_shape), out_dtype),),
        [o._input() for o in operands],
        cond=cond,
        name=name,
    )
    return RecurrentTensor(ctx, node)


def materialize(x: RecurrentTensor) -> RecurrentTensor:
    """A copy of ``x`` as its own node (identity access)."""
    return _apply(OpKind.IDENTITY, [x], x.shape, x.dtype)


def _promote(a: RecurrentTensor, b: RecurrentTensor) -> DType:
    return _promote_dtypes(a.dtype, b.dtype)


def _promote_dtypes(a: DType, b: DType) -> DType:
    if a is b:
        return a
    order = [DType.bool_, DType.int32, DType.int64, DType.float32, DType.float64]
    return max(a, b, key=order.index)


def to_rt(x: Any, like: RecurrentTensor | None = None) -> RecurrentTensor:
    """Coerce numbers, arrays and symbolic expressions to RTs."""
    if isinstance(x, RecurrentTensor):
        return x
    from timerl.rt.creation import as_tensor, const

    if isinstance(x, Expr):
        return as_tensor(x, DType.float32 if like is None or like.dtype.is_float else like.dtype)
    if isinstance(x, (bool, np.bool_)):
        return const(np.asarray(x, dtype=np.bool_))
    if isinstance(x, (int, float, np.number)):
        dt = (
            like.dtype
            if like is not None and (like.dtype.is_float or isinstance(x, (int, np.integer)))
            else DType.float32
        )
        if isinstance(x, float) and not dt.is_float:
            dt = DType.float32
        return const(np.asarray(x, dtype=dt.numpy))
    return const(np.asarray(x))


def unary(kind: OpKind, x: RecurrentTensor) -> RecurrentTensor:
    dtype = DType.bool_ if kind is OpKind.LOGICAL_NOT else x.dtype
    if kind in (OpKind.EXP, OpKind.LOG, OpKind.SQRT, OpKind.TANH, OpKind.SIGMOID) and not x.dtype.is_float:
        x = x.cast(DType.float32)
        dtype = DType.float32
    return _apply(kind, [x], x.shape, dtype)


def binary(kind: OpKind, a: Any, b: Any) -> RecurrentTensor:
    if not isinstance(a, RecurrentTensor):
        a = to_rt(a, b)
    if not isinstance(b, RecurrentTensor):
        b = to_rt(b, a)
    shape = S.broadcast([a.shape, b.shape], _operands(kind.name.lower(), a, b))
    dt = _promote(a, b)
    if kind is OpKind.DIV and not dt.is_float:
        dt = DType.float32
    a, b = a.cast(dt), b.cast(dt)
    from timerl.pdg.ops import COMPARISON_OPS

    out_dt = DType.bool_ if kind in COMPARISON_OPS else dt
    return _apply(kind, [a, b], shape, out_dt)


def _operands(what: str, *xs: RecurrentTensor) -> str:
    """``add of 'a' and 'b'``: an op and its operands, for shape errors."""
    names = [x.node.label for x in xs]
    return f"{what} of {', '.join(names[:-1])} and {names[-1]}" if len(names) > 1 else f"{what} of {names[0]}"


def matmul(a: Any, b: Any) -> RecurrentTensor:
    a, b = (
        to_rt(a, b if isinstance(b, RecurrentTensor) else None),
        to_rt(b, a if isinstance(a, RecurrentTensor) else None),
    )
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul needs operands with at least one per-point dim")
    ka = a.shape[-1]
    kb = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if not S.dims_equal(ka, kb):
        raise ShapeError(
            f"{_operands('matmul', a, b)}: per-point shapes {a.shape} @ {b.shape} do not match "
            f"({ka} vs {kb}); the last dim of the left operand must equal the "
            f"{'first' if b.ndim == 1 else 'second-to-last'} dim of the right one"
        )
    batch = S.broadcast([a.shape[:-2], b.shape[:-2]], _operands("matmul batch dims", a, b))
    shape = batch + (a.shape[-2:-1] if a.ndim >= 2 else ()) + (b.shape[-1:] if b.ndim >= 2 else ())
    dt = _promote(a, b)
    return _apply(OpKind.MATMUL, [a.cast(dt), b.cast(dt)], shape, dt)


def where(cond: Any, a: Any, b: Any) -> RecurrentTensor:
    """``a`` where ``cond`` holds else ``b`` (elementwise, broadcasting)."""
    if isinstance(cond, Expr):
        from timerl.rt.creation import as_tensor

        cond = as_tensor(cond, DType.bool_)
    ref = a if isinstance(a, RecurrentTensor) else b if isinstance(b, RecurrentTensor) else None
    cond = to_rt(cond)
    a, b = to_rt(a, ref), to_rt(b, ref)
    shape = S.broadcast([cond.shape, a.shape, b.shape], _operands("where (cond, a, b)", cond, a, b))
    dt = _promote(a, b)
    a, b = a.cast(dt), b.cast(dt)
    if cond.dtype is not DType.bool_:
        cond = cond.cast(DType.bool_)
    return _apply(OpKind.WHERE, [cond, a, b], shape, dt)


def softmax(x: RecurrentTensor, dim: int = -1) -> RecurrentTensor:
    d = S.norm_axis(dim, x.ndim, "softmax")
    return _apply(OpKind.SOFTMAX, [x], x.shape, x.dtype, dim=d)


def log_softmax(x: RecurrentTensor, dim: int = -1) -> RecurrentTensor:
    d = S.norm_axis(dim, x.ndim, "log_softmax")
    return _apply(OpKind.LOG_SOFTMAX, [x], x.shape, x.dtype, dim=d)


def cat(xs: Sequence[RecurrentTensor], dim: int = 0) -> RecurrentTensor:
    xs = [to_rt(x) for x in xs]
    nd = xs[0].ndim
    d = S.norm_axis(dim, nd, "cat")
    size: Any = 0
    for x in xs:
        if x.ndim != nd:
            raise ShapeError(f"cat: per-point ranks differ: {[x.shape for x in xs]}")
        size = S.norm_dim(lift(size) + lift(x.shape[d]))
    shape = xs[0].shape[:d] + (size,) + xs[0].shape[d + 1 :]
    xs, dt = _common_dtype(xs)
    return _apply(OpKind.CAT, xs, shape, dt, dim=d)


def stack(xs: Sequence[RecurrentTensor], dim: int = 0) -> RecurrentTensor:
    xs = [to_rt(x) for x in xs]
    shape = S.broadcast([x.shape for x in xs], "stack")
    d = S.norm_axis(dim, len(shape) + 1, "stack")
    xs = [x if x.shape == shape else x.expand(shape) for x in xs]
    xs, dt = _common_dtype(xs)
    return _apply(OpKind.STACK, xs, shape[:d] + (len(xs),) + shape[d:], dt, dim=d)


def _common_dtype(xs: list[RecurrentTensor]) -> tuple[list[RecurrentTensor], DType]:
    """``xs`` cast to the dtype they promote to (as a binary op promotes its operands)."""
    dt = xs[0].dtype
    for x in xs[1:]:
        dt = _promote_dtypes(dt, x.dtype)
    return [x.cast(dt) for x in xs], dt


def as_float(e: Expr) -> RecurrentTensor:
    from timerl.rt.creation import as_tensor

    return as_tensor(e, DType.float32)


# -- branching definitions ---------------------------------------------------------------


def define_branch(x: RecurrentTensor, idx: Any, value: Any) -> None:
    """``x[idx] = value``: add a branching definition to the MERGE node behind ``x``.

    A point takes the first branch, in the order written, whose index covers it and whose
    value is defined there. The ops computing ``value`` are first restricted to the points
    where their own reads are in range (:func:`_restrict_to_defined`), so the general case
    of ``adv[T - 1] = ...; adv[t] = delta + g * adv[t + 1]`` does not read ``adv[T]``.
    """
    node = x.node
    if node.op.kind is not OpKind.MERGE or not x.is_identity:
        raise RTDefinitionError(
            f"cannot assign into {x!r}: only RTs made with trl.empty/like/param (undefined RTs "
            "filled by branching definitions) accept `x[...] = value`"
        )
    if not isinstance(idx, tuple):
        idx = (idx,)
    ctx = x.ctx
    if len(idx) > len(node.domain):
        raise RTDefinitionError(
            f"branching definition of {x.node.label}: {len(idx)} indices for a domain of "
            f"{len(node.domain)} dims ({', '.join(s.name for s in node.domain)})"
        )
    entries = [lift(e) if not isinstance(e, slice) else e for e in idx] + list(node.domain[len(idx) :])
    cover: Expr = TRUE
    shift: dict[Sym, Expr] = {}
    for d, e in zip(node.domain, entries, strict=True):
        if isinstance(e, slice) or isinstance(e, Slice):
            if isinstance(e, slice) and e.start is None and e.stop is None:
                continue
            raise RTDefinitionError(
                f"branching definition of {node.label}: slice index `{e}` on dim `{d}` is not "
                "supported; define points with `t`, `t + k` or a constant"
            )
        _check_affine(
            x,
            e,
            f"on dim `{d}` in a branching definition",
            f"define points with `{d}`, `{d} + k` or an expression of the bounds such as `{ctx.bound_of(d)} - 1`",
        )
        syms = index_symbols(e)
        bound = ctx.bound_of(d)
        if not syms:
            cover = logical_and(cover, d == e)
            shift[d] = e
            continue
        aff = affine_in(e, d)
        if syms != {d} or aff is None or aff[0] != 1:
            raise RTDefinitionError(
                f"branching definition of {node.label}: index `{e}` on dim `{d}` must be "
                f"`{d}`, `{d} + k` or an expression without index symbols"
            )
        pre = d - aff[1]  # the RHS is evaluated at this point of d
        if pre is not d:
            cover = logical_and(cover, logical_and(pre >= 0, pre < bound))
            shift[d] = pre
    v = to_rt(value, x)
    # The adapters (cast, implicit expand) are ops of the branch value too: record them
    # before the restriction, so that an adapter of a shifted read (`n[t] = v[t + 1]` with
    # a broadcast `v`) is restricted to the points where its read is in range.
    if v.dtype is not x.dtype:
        v = v.cast(x.dtype)
    if not all(S.dims_equal(a, b) for a, b in zip(v.shape, x.shape, strict=False)) or v.ndim != x.ndim:
        S.broadcast(
            [v.shape, x.shape],
            f"branching definition of {node.label} (per-point shape {x.shape}) with a value of "
            f"per-point shape {v.shape}",
        )
        v = v.expand(x.shape)
    v = _restrict_to_defined(v)
    extra = set(v.domain) - set(node.domain)
    if extra:
        raise RTDefinitionError(
            f"branching definition of {node.label}: the value varies over "
            f"{sorted(s.name for s in extra)}, which are not dims of the defined RT"
        )
    phi = tuple(substitute(c, shift) for c in v.phi)
    vcond = substitute(v.cond, shift)
    # A point takes the first branch (in the order written) that covers it.
    prior: Expr = TRUE
    earlier = node.inputs
    for b in earlier:
        prior = logical_and(prior, logical_not(b.cond))
    node.inputs.append(BInput(v.node.id, v.oid, phi, logical_and(logical_and(cover, vcond), prior)))


_EFFECT_KINDS = frozenset({OpKind.MERGE, OpKind.UDF, OpKind.SINK, OpKind.SET_SYMBOL})


def _restrict_to_defined(v: RecurrentTensor) -> RecurrentTensor:
    """Shrink the domains of the ops computing a branch value to where they are defined.

    In ``adv[T - 1] = delta[T - 1]; adv[t] = delta + g * adv[t + 1]`` the op
    ``adv[t + 1] * g`` was recorded over all of ``t`` before the assignment, so at
    ``t = T - 1`` it would read ``adv[T]``, which does not exist, and the compile-time
    read check rejects the program even though that branch is never taken there. This
    walks back from the branch value along pointwise (identity) reads and, for every op
    that reads an input at a shifted point ``d + k``, adds ``0 <= d + k < D`` to its
    domain condition; ops that read such an op pointwise inherit the condition. Only
    points where the op reads outside its input's domain are removed, i.e. points with
    no value anyway, so no well-defined point changes; a later read of a removed point
    is still a compile-time error. Effectful ops (UDFs, sinks), MERGEs and parameters
    are never restricted. A branch value that is itself an indexed view (``delta[T-1]``)
    is left alone: the MERGE's definedness check covers it.
    """
    if not v.is_identity:
        return v
    nodes = v.ctx.graph.nodes

    def pointwise(inp: BInput) -> bool:
        src = nodes[inp.src].domain
        return len(inp.phi) == len(src) and all(c is d for c, d in zip(inp.phi, src, strict=True))

    def walks_into(nid: int) -> bool:
        n = nodes[nid]
        return n.op.kind not in _EFFECT_KINDS and not n.is_param

    # Post-order over pointwise reads, iteratively (value chains can be long).
    memo: dict[int, Expr] = {}
    stack: list[tuple[int, bool]] = [(v.node.id, False)]
    while stack:
        nid, expanded = stack.pop()
        if nid in memo:
            continue
        if not walks_into(nid):
            memo[nid] = TRUE
            continue
        n = nodes[nid]
        usable = [inp for inp in n.inputs if inp.cond is TRUE and inp.select is None]
        if not expanded:
            stack.append((nid, True))
            stack.extend((inp.src, False) for inp in usable if pointwise(inp) and inp.src not in memo)
            continue
        r: Expr = TRUE
        for inp in usable:
            if pointwise(inp):
                r = logical_and(r, memo.get(inp.src, TRUE))  # absent only on a cycle
            else:
                for d, c in zip(nodes[inp.src].domain, inp.phi, strict=True):
                    r = logical_and(r, _in_range(v.ctx, c, d))
        if r is not TRUE:
            n.cond = logical_and(n.cond, r)
        memo[nid] = r
    if memo[v.node.id] is TRUE:
        return v
    return RecurrentTensor(v.ctx, v.node, v.oid)


def _in_range(ctx: Context, c: Index, d: Sym) -> Expr:
    """The condition under which index ``c`` (a shift ``q + k`` of one symbol) lies in dim ``d``."""
    if isinstance(c, Slice):
        return TRUE
    syms = index_symbols(c)
    if len(syms) != 1:
        return TRUE
    (q,) = syms
    aff = affine_in(c, q)
    if aff is None or aff[0] != 1 or not isinstance(aff[1], Const) or aff[1].value == 0:
        return TRUE
    k = aff[1].value
    return c < ctx.bound_of(d) if k > 0 else c >= 0

"""Creating recurrent tensors: constants, undefined RTs, parameters, symbol values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from timerl.errors import RTDefinitionError
from timerl.pdg.ir import TensorSpec
from timerl.pdg.ops import DType, Op, OpKind
from timerl.rt import shapes as S
from timerl.rt.context import current
from timerl.rt.tensor import RecurrentTensor
from timerl.symbolic import Expr, Sym, index_symbols, lift

float32 = DType.float32
float64 = DType.float64
int32 = DType.int32
int64 = DType.int64
bool_ = DType.bool_


def _domain(domain: Sequence[Sym] | None) -> tuple[Sym, ...]:
    ctx = current()
    return ctx.order(tuple(domain or ()))


def _shape(shape: Any) -> tuple[Any, ...]:
    if isinstance(shape, (int, Expr)):
        shape = (shape,)
    return S.norm_shape(tuple(shape))


def empty(
    shape: Any = (), dtype: DType = float32, domain: Sequence[Sym] = (), name: str | None = None
) -> RecurrentTensor:
    """An undefined RT, to be filled by branching definitions (``x[t + 1] = ...``)."""
    ctx = current()
    node = ctx.graph.add(
        Op.make(OpKind.MERGE), _domain(domain), (TensorSpec(_shape(shape), dtype),), name=name
    )
    return RecurrentTensor(ctx, node)


def like(space: Any, domain: Sequence[Sym] = (), name: str | None = None) -> RecurrentTensor:
    """An undefined RT shaped like one element of a gymnasium space (``env.obs_space``)."""
    shape, dtype = space_spec(space)
    return empty(shape, dtype, domain, name)


def space_spec(space: Any) -> tuple[tuple[int, ...], DType]:
    """Per-point shape and dtype of one element of a gymnasium space."""
    import gymnasium as gym

    if isinstance(space, gym.spaces.Discrete):
        return (), DType.int64
    if isinstance(space, gym.spaces.MultiDiscrete) and len(space.nvec.shape) == 1:
        return (int(space.nvec.shape[0]),), DType.int64
    if isinstance(space, gym.spaces.Box):
        return tuple(int(d) for d in space.shape), DType.from_numpy(space.dtype)
    if isinstance(space, TensorSpec):
        return tuple(space.shape), space.dtype  # type: ignore[return-value]
    raise RTDefinitionError(
        f"unsupported space {space!r}: use a gymnasium Box, Discrete or flat MultiDiscrete space"
    )


def const(
    value: Any, dtype: DType | None = None, domain: Sequence[Sym] = (), name: str | None = None
) -> RecurrentTensor:
    """An RT holding ``value`` (array-like) at every point of ``domain``."""
    arr = np.asarray(value)
    if dtype is None:
        dtype = DType.float32 if arr.dtype.kind == "f" else DType.from_numpy(arr.dtype)
    arr = np.array(arr, dtype=dtype.numpy, order="C")
    ctx = current()
    node = ctx.graph.add(
        Op.make(OpKind.CONST, value=arr), _domain(domain), (TensorSpec(tuple(arr.shape), dtype),), name=name
    )
    return RecurrentTensor(ctx, node)


def full(
    shape: Any, value: float, dtype: DType = float32, domain: Sequence[Sym] = (), name: str | None = None
) -> RecurrentTensor:
    shape = _shape(shape)
    if any(isinstance(d, Expr) for d in shape):
        raise RTDefinitionError(f"full/zeros/ones need a concrete shape, got {shape}")
    return const(np.full(shape, value, dtype=dtype.numpy), dtype, domain, name)


def zeros(
    shape: Any = (), dtype: DType = float32, domain: Sequence[Sym] = (), name: str | None = None
) -> RecurrentTensor:
    return full(shape, 0, dtype, domain, name)


def ones(
    shape: Any = (), dtype: DType = float32, domain: Sequence[Sym] = (), name: str | None = None
) -> RecurrentTensor:
    return full(shape, 1, dtype, domain, name)


def rand(
    shape: Any = (),
    domain: Sequence[Sym] = (),
    dtype: DType = float32,
    normal: bool = False,
    name: str | None = None,
) -> RecurrentTensor:
    """Uniform [0, 1) samples (``normal=True``: standard normal), fresh at every point.

    The draws depend on the run's seed, the point and the op's stream: the number of random
    ops the program created before it (so other ops, and agent dims, do not change them)."""
    ctx = current()
    kind = OpKind.RAND_NORMAL if normal else OpKind.RAND_UNIFORM
    shp = _shape(shape)
    stream = ctx.graph.random_ops
    ctx.graph.random_ops += 1
    node = ctx.graph.add(
        Op.make(kind, shape=shp, dtype=dtype, stream=stream),
        _domain(domain),
        (TensorSpec(shp, dtype),),
        name=name,
    )
    return RecurrentTensor(ctx, node)


def randn(
    shape: Any = (), domain: Sequence[Sym] = (), dtype: DType = float32, name: str | None = None
) -> RecurrentTensor:
    """Standard normal samples, fresh at every point (``rand(..., normal=True)``)."""
    return rand(shape, domain, dtype, normal=True, name=name)


def as_tensor(
    expr: Any, dtype: DType = float32, name: str | None = None, domain: Sequence[Sym] = ()
) -> RecurrentTensor:
    """An RT whose value at each point is ``expr`` evaluated there (``as_tensor(t)``).

    Its domain is the dims ``expr`` mentions plus ``domain``: give the outer dims when a
    dim's bound depends on them, e.g. ``as_tensor(t % 2, domain=(i,))`` where ``T`` is
    each iteration's episode length (over ``t`` alone it would need one ``T`` for all ``i``).
    """
    e = lift(expr)
    ctx = current()
    node = ctx.graph.add(
        Op.make(OpKind.EVAL_SYMBOL, expr=e, dtype=dtype),
        ctx.order(set(index_symbols(e)) | set(domain)),
        (TensorSpec((), dtype),),
        name=name,
    )
    return RecurrentTensor(ctx, node)


def param(
    init: Any,
    domain: Sequence[Sym] = (),
    name: str | None = None,
    dtype: DType | None = None,
    agents: Sequence[Sym] = (),
) -> RecurrentTensor:
    """A parameter: ``w[0] = init`` over ``domain`` (e.g. ``(i,)``); later points come from an optimiser.

    With an empty domain the parameter is a constant leaf (gradients still flow to it).

    ``agents``: dims of ``domain`` along which independent agents are trained in one program
    (``domain=(i, s), agents=(s,)``; put the agent dim last in the context's dims, so that
    indices like ``x[b, i]`` leave it implicit): ``init`` then holds one entry per agent
    along each (shape ``(S, *shape)``; ``S`` must be the dim's bound), agent ``k`` starts from
    ``init[k]``, and optimisers step the other dims only (``w[i + 1, s]`` from ``w[i, s]``).
    """
    from timerl.rt.tensor import to_rt

    ctx = current()
    dom = _domain(domain)
    ag = _domain(agents)
    if any(not any(a is d for d in dom) for a in ag) or len(ag) >= max(len(dom), 1):
        raise RTDefinitionError(
            f"param {name or ''}: agents={tuple(s.name for s in ag)} must be dims of its domain "
            f"{tuple(s.name for s in dom)}, with at least one other dim for the updates (e.g. "
            "domain=(i, s), agents=(s,))"
        )
    if ag and isinstance(init, RecurrentTensor):
        raise RTDefinitionError(
            f"param {name or ''}: with agents=..., give the init as an array (one entry per agent)"
        )
    init_rt = to_rt(init) if not isinstance(init, RecurrentTensor) else init
    if dtype is not None:
        init_rt = init_rt.cast(dtype)
    if init_rt.domain:
        raise RTDefinitionError(f"param init must not vary over symbolic dims, got domain {init_rt.domain}")
    if len(init_rt.shape) < len(ag):
        raise RTDefinitionError(
            f"param {name or ''}: agents={tuple(s.name for s in ag)} needs an init with a leading dim per "
            f"agent dim, got shape {init_rt.shape}"
        )
    w = empty(init_rt.shape[len(ag) :], init_rt.dtype, dom, name)
    w.node.is_param = True
    w.node.agents = ag
    w.node.agent_sizes = tuple(int(k) for k in init_rt.shape[: len(ag)])
    if ag:
        w[tuple(d if any(d is a for a in ag) else 0 for d in dom)] = init_rt[ag]
    elif dom:
        w[tuple(0 for _ in dom)] = init_rt
    else:
        w.node.inputs.append(init_rt._input())
    del ctx
    return w

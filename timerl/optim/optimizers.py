"""SGD and Adam as branching definitions over the parameters' dims.

Each parameter ``w`` (``trl.param``, domain ``(i,)``) gets ``w[i + 1] = ...`` from its
gradient ``w.grad`` at ``i``; Adam's moments are RTs defined the same way. The learning
rate may be a float or an RT (a schedule such as ``lr[i] = lr0 * 0.99**i``).

A parameter over several dims, e.g. ``(i, e)`` for PPO's epochs or ``(i, e, m)`` with
minibatches, is updated along its dims as one mixed-radix counter: the innermost dim
steps (``w[i, e + 1] = ...``) and its last update carries into the next outer point
(``w[i + 1, 0] = new[i, E - 1]``). The inner dims need static bounds; the update count
(Adam's bias correction) is the flattened index plus one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from timerl.errors import RTDefinitionError
from timerl.rt.context import current
from timerl.rt.creation import as_tensor, empty, ones, zeros
from timerl.rt.tensor import RecurrentTensor, where


def _check(params: Sequence[RecurrentTensor]) -> None:
    for p in params:
        if not p.node.is_param or not p.node.domain:
            raise RTDefinitionError(
                f"optimiser: {p!r} is not a trl.param with a symbolic domain such as (i,)"
            )


def _is(d: Any, dims: Sequence[Any]) -> bool:
    return any(d is x for x in dims)


def _assign_next(p: RecurrentTensor, new: RecurrentTensor) -> None:
    """``p`` at the next update point := ``new`` (the update computed at this point).

    For update dims ``(d0, ..., dk)``: ``p[d0, ..., dk + 1] = new`` and, for each outer level
    ``j < k``, ``p[d0, ..., dj + 1, 0, ..., 0] = new[d0, ..., dj, Bj+1 - 1, ..., Bk - 1]``.
    A parameter's agent dims (``trl.param(agents=...)``) are not update dims: each agent's
    updates stay at its own coordinate.
    """
    dom = tuple(p.node.domain)
    upd = [d for d in dom if not _is(d, p.node.agents)]
    ctx = current()
    for j in range(len(upd) - 1, -1, -1):
        inner = upd[j + 1 :]
        target = tuple(d + 1 if d is upd[j] else (0 if _is(d, inner) else d) for d in dom)
        if not inner:
            p[target] = new
        else:
            p[target] = new[tuple(ctx.bound_of(d) - 1 if _is(d, inner) else d for d in dom)]


def _update_count(p: RecurrentTensor) -> RecurrentTensor:
    """How many updates precede this point's, plus one: the flattened mixed-radix index of
    the update dims (not the agent dims) + 1."""
    dom = [d for d in p.node.domain if not _is(d, p.node.agents)]
    ctx = current()
    k: Any = dom[0]
    for d in dom[1:]:
        k = k * ctx.bound_of(d) + d
    return as_tensor(k + 1)


def _state_of(p: RecurrentTensor, name: str | None = None) -> RecurrentTensor:
    """An optimiser state tensor over ``p``'s domain, with ``p``'s agent dims (one per agent)."""
    x = empty(p.shape, p.dtype, p.node.domain, name=name)
    x.node.agents, x.node.agent_sizes = p.node.agents, p.node.agent_sizes
    return x


def _first(p: RecurrentTensor) -> tuple[Any, ...]:
    """The index of each agent's first update point: 0 along the update dims."""
    return tuple(d if _is(d, p.node.agents) else 0 for d in p.node.domain)


def clipped_grads(params: Sequence[RecurrentTensor], max_norm: float | None) -> list[RecurrentTensor]:
    """The parameters' gradients, scaled together so that their global L2 norm (over all
    of them, at each update point) is at most ``max_norm`` (as ``clip_grad_norm_``)."""
    grads = [p.grad for p in params]
    if not max_norm:
        return grads
    sq = None
    for g in grads:
        s = (g * g).sum()
        sq = s if sq is None else sq + s
    assert sq is not None
    norm = sq.sqrt()
    ratio = float(max_norm) / (norm + 1e-6)
    scale = where(ratio < 1.0, ratio, ones(()))
    return [g * scale for g in grads]


class SGD:
    """``w[i + 1] = w[i] - lr * grad[i]`` (with optional momentum)."""

    def __init__(
        self,
        params: Sequence[RecurrentTensor],
        lr: Any = 1e-2,
        momentum: float = 0.0,
        max_grad_norm: float | None = None,
    ) -> None:
        _check(params)
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.max_grad_norm = max_grad_norm

    def step(self) -> None:
        for p, g in zip(self.params, clipped_grads(self.params, self.max_grad_norm), strict=True):
            if self.momentum:
                buf = _state_of(p)
                buf[_first(p)] = zeros(p.shape, p.dtype)
                g = buf * self.momentum + g
                _assign_next(buf, g)
            _assign_next(p, p - g * self.lr)


class Adam:
    """Adam (Kingma & Ba, 2015) with bias correction; the step count is ``i + 1``.
    ``max_grad_norm`` clips the gradients' global norm first (off by default)."""

    def __init__(
        self,
        params: Sequence[RecurrentTensor],
        lr: Any = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        max_grad_norm: float | None = None,
    ) -> None:
        _check(params)
        self.params, self.lr, self.betas, self.eps = list(params), lr, betas, eps
        self.max_grad_norm = max_grad_norm

    def step(self) -> None:
        b1, b2 = self.betas
        for p, g in zip(self.params, clipped_grads(self.params, self.max_grad_norm), strict=True):
            first = _first(p)
            m = _state_of(p, f"{p.name}.adam_m" if p.name else None)
            v = _state_of(p, f"{p.name}.adam_v" if p.name else None)
            m[first] = zeros(p.shape, p.dtype)
            v[first] = zeros(p.shape, p.dtype)
            m_new = m * b1 + g * (1 - b1)
            v_new = v * b2 + g * g * (1 - b2)
            _assign_next(m, m_new)
            _assign_next(v, v_new)
            k = _update_count(p)
            mhat = m_new / (1.0 - b1**k)
            vhat = v_new / (1.0 - b2**k)
            _assign_next(p, p - self.lr * mhat / (vhat.sqrt() + self.eps))

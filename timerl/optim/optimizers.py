"""SGD and Adam as branching definitions over the parameters' first dim.

Each parameter ``w`` (``trl.param``, domain ``(i, ...)``) gets ``w[i + 1] = ...`` from
its gradient ``w.grad`` at ``i``; Adam's moments are RTs defined the same way. The
learning rate may be a float or an RT (a schedule such as ``lr[i] = lr0 * 0.99**i``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from timerl.errors import RTDefinitionError
from timerl.rt.creation import as_tensor, empty, zeros
from timerl.rt.tensor import RecurrentTensor


def _check(params: Sequence[RecurrentTensor]) -> None:
    for p in params:
        if not p.node.is_param or not p.node.domain:
            raise RTDefinitionError(
                f"optimiser: {p!r} is not a trl.param with a symbolic domain such as (i,)"
            )


def _next(p: RecurrentTensor) -> tuple[Any, ...]:
    d0 = p.node.domain[0]
    return (d0 + 1,) + tuple(p.node.domain[1:])


class SGD:
    """``w[i + 1] = w[i] - lr * grad[i]`` (with optional momentum)."""

    def __init__(self, params: Sequence[RecurrentTensor], lr: Any = 1e-2, momentum: float = 0.0) -> None:
        _check(params)
        self.params, self.lr, self.momentum = list(params), lr, momentum

    def step(self) -> None:
        for p in self.params:
            g = p.grad
            if self.momentum:
                buf = empty(p.shape, p.dtype, p.node.domain)
                buf[tuple(0 for _ in p.node.domain)] = zeros(p.shape, p.dtype)
                buf[_next(p)] = buf * self.momentum + g
                g = buf * self.momentum + g
            p[_next(p)] = p - g * self.lr


class Adam:
    """Adam (Kingma & Ba, 2015) with bias correction; the step count is ``i + 1``."""

    def __init__(
        self,
        params: Sequence[RecurrentTensor],
        lr: Any = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        _check(params)
        self.params, self.lr, self.betas, self.eps = list(params), lr, betas, eps

    def step(self) -> None:
        b1, b2 = self.betas
        for p in self.params:
            g = p.grad
            dom = p.node.domain
            first = tuple(0 for _ in dom)
            m = empty(p.shape, p.dtype, dom, name=f"{p.name}.adam_m" if p.name else None)
            v = empty(p.shape, p.dtype, dom, name=f"{p.name}.adam_v" if p.name else None)
            m[first] = zeros(p.shape, p.dtype)
            v[first] = zeros(p.shape, p.dtype)
            m_new = m * b1 + g * (1 - b1)
            v_new = v * b2 + g * g * (1 - b2)
            m[_next(p)] = m_new
            v[_next(p)] = v_new
            k = as_tensor(dom[0] + 1)
            mhat = m_new / (1.0 - b1**k)
            vhat = v_new / (1.0 - b2**k)
            p[_next(p)] = p - self.lr * mhat / (vhat.sqrt() + self.eps)

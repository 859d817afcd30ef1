"""Sizes the PDG implies: padded batch axes (``bucket(T)``) and bytes per point.

A batch axis vectorized over a dim with a dynamic bound ``T`` is padded to ``bucket(T)``,
the smallest power of two ``>= T`` (``vectorize_partial``), so compiled code is reused
across episode lengths; :func:`resolve_batch` gives a node's batch for a known ``T``.
:func:`point_bytes` / :func:`output_bytes` size one point of each node (the scheduler's
swapping and the plan's peak estimate use them)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from timerl.pdg.ir import PDG
from timerl.symbolic import Sym
from timerl.symbolic.compile import compile_expr


def bucket(n: int) -> int:
    """The padded length of a batch axis whose dynamic bound has the value ``n``: the
    smallest power of two ``>= n`` (compiled code is then reused across lengths)."""
    return 1 << (max(int(n), 1) - 1).bit_length()


def is_padded(batch: tuple[Any, ...]) -> bool:
    """Whether a node's ``batch`` has an axis padded to a bucket of a dynamic bound."""
    return any(isinstance(x, Sym) for x in batch)


def resolve_batch(batch: tuple[Any, ...], env: Mapping[Sym, int]) -> tuple[int, ...]:
    """A node's ``batch`` with each dynamic bound ``T`` replaced by ``bucket(T)`` (``env``
    holds the node's episode's ``T``)."""
    return tuple(bucket(env[x]) if isinstance(x, Sym) else int(x) for x in batch)


def dynamic_values(pdg: PDG, value: int | Mapping[str, int]) -> dict[Sym, int]:
    """Each dynamic bound of ``pdg`` at ``value`` (one int for all, or per bound name; 1 where
    a mapping has no entry)."""
    if isinstance(value, Mapping):
        return {s: int(value.get(s.name, 1)) for s in pdg.dynamic_bounds}
    return {s: value for s in pdg.dynamic_bounds}


def point_bytes(pdg: PDG, dynamic_value: int | Mapping[str, int] = 1) -> dict[int, int]:
    """Bytes one point of each node holds (all outputs), symbolic dims evaluated with the
    static bounds, every dynamic bound at ``dynamic_value`` and the node's own dims at
    their last value."""
    return {nid: sum(b) for nid, b in output_bytes(pdg, dynamic_value).items()}


def output_bytes(pdg: PDG, dynamic_value: int | Mapping[str, int] = 1) -> dict[int, tuple[int, ...]]:
    """:func:`point_bytes` per output of each node."""
    env: dict[Sym, int] = {s: int(v) for s, v in pdg.static_bounds.items()}
    env.update(dynamic_values(pdg, dynamic_value))
    # shapes that vary per point (``T - t``, an incrementalized block ``min(bs, N - bs*di)``)
    # are taken at index 0, where they are longest
    env.update({s: 0 for s, _ in pdg.dims})
    out = {}
    for n in pdg:
        sizes = []
        # a shape over the node's dims (a window ``x[t - 1:t + 1]``): at the last point
        at = {**env, **{d: max(0, env.get(pdg.bound_of(d), 1) - 1) for d in n.domain}}
        for spec in n.outputs:
            dims = [d if isinstance(d, int) else int(compile_expr(d)(at)) for d in spec.shape]
            sizes.append(
                math.prod(resolve_batch(tuple(n.batch), env)) * math.prod(dims) * spec.dtype.numpy.itemsize
            )
        out[n.id] = tuple(sizes)
    return out

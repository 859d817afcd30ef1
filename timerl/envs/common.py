"""Helpers shared by the environment wrappers (gym, brax, gymnax, LoopTune, Tiramisu)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from timerl.errors import RTDefinitionError
from timerl.symbolic import Sym

T = TypeVar("T")


def static_num_envs(env_id: str, num_envs: int | Sym, bounds: Mapping[Sym, int]) -> int:
    """``num_envs`` as an int: itself, or the static value of its bound symbol."""
    n = bounds.get(num_envs, None) if isinstance(num_envs, Sym) else int(num_envs)
    if n is None:
        raise RTDefinitionError(f"env {env_id}: num_envs bound {num_envs} needs a static value")
    return int(n)


def agent_seeds(env_id: str, seed: int | Sequence[int], agents: Sym | None) -> list[int]:
    """The env seeds of each agent: ``[seed]`` without agents; with agents, a list gives one
    per agent and an int ``seed`` is expanded to ``seed + k`` once the agent count is known
    (:func:`bind_agent_seeds`), as ``ctx.compile(seed=...)`` seeds random ops."""
    if isinstance(seed, (int, np.integer)):
        return [int(seed)]
    if agents is None:
        raise RTDefinitionError(
            f"env {env_id}: seed={list(seed)!r} gives one seed per agent; pass agents=S too"
        )
    return [int(x) for x in seed]


def bind_agent_seeds(env_id: str, seeds: list[int], agents: Sym, bounds: Mapping[Sym, int]) -> list[int]:
    """``seeds`` for the ``bounds[agents]`` agents (see :func:`agent_seeds`)."""
    n = bounds.get(agents)
    if n is None:
        raise RTDefinitionError(f"env {env_id}: the agent bound {agents} needs a static value")
    if len(seeds) == int(n):
        return seeds
    if len(seeds) == 1:
        return [seeds[0] + k for k in range(int(n))]
    raise RTDefinitionError(
        f"env {env_id}: {len(seeds)} seeds for {n} agents ({agents} = {n}); give one per agent"
    )


def pick_batch(items: Sequence[T], k: int, n: int, in_order: bool, seed: int) -> list[T]:
    """The ``n`` items of reset ``k``: consecutive ones in order (wrapping), else drawn with
    ``numpy.random.default_rng(seed + 7919 * k)``."""
    if in_order:
        return [items[(k * n + e) % len(items)] for e in range(n)]
    rng = np.random.default_rng(seed + 7919 * k)
    return [items[int(i)] for i in rng.integers(0, len(items), n)]


def jax_argument(x: Any, device: Any) -> Any:
    """``x`` (a ``jax.Array``, or a DLPack exporter such as a torch tensor) as an argument of a
    function jitted for ``device``.

    A ``jax.Array`` already committed to ``device`` goes as it is. A host buffer for a host
    device goes as a NumPy view, copied in by the jitted call itself: importing it through
    ``jax.dlpack.from_dlpack`` and ``device_put`` cost about 0.35 ms a step at 512 envs
    (2-core CPU), seven times the call. Anything else is imported and placed on ``device``.
    """
    import jax

    if isinstance(x, jax.Array):
        if x.committed and x.devices() == {device}:
            return x
        return jax.device_put(x, device)
    if device.platform == "cpu" and x.__dlpack_device__()[0] == _DLPACK_CPU:
        return np.from_dlpack(x)
    return jax.device_put(jax.dlpack.from_dlpack(x), device)


_DLPACK_CPU = 1  # kDLCPU in DLPack's DLDeviceType

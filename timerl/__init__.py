"""timerl: deep-RL programs as recurrent tensors, scheduled with isl, run on JAX or PyTorch.

Public API (``docs/api.md`` documents every name of ``__all__``; ``docs/tutorial.md`` and
``docs/architecture.md`` show them at work)::

    import timerl as trl
    with trl.Context(num_dims=2) as ((i, I), (t, T)):
        ...
    executor = ctx.compile({I: 10, T: 5}, backend="jax"); executor.execute()

``trl.env`` (environments), ``trl.agents`` (agent programs) and ``trl.dist`` (Ray runners) are
imported on first use, so ``import timerl`` loads neither gymnasium, an agent nor Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from timerl import nn, optim, run
from timerl.errors import (
    AutodiffError,
    BackendError,
    BoundError,
    DistributedError,
    EnvNotResetError,
    MemoryBudgetError,
    NonAffineIndexError,
    PDGError,
    RTDefinitionError,
    RuntimeExecutionError,
    ScheduleError,
    ShapeError,
    SymbolicError,
    TimeRLError,
    UndefinedPointError,
)
from timerl.nn import DNNBuilder
from timerl.rt.context import Context
from timerl.rt.creation import (
    as_tensor,
    bool_,
    const,
    empty,
    float32,
    float64,
    full,
    int32,
    int64,
    like,
    ones,
    param,
    rand,
    randn,
    zeros,
)
from timerl.rt.tensor import RecurrentTensor, cat, log_softmax, softmax, stack, where
from timerl.rt.udf import udf

# Symbolic min / max of index expressions (``x[t : trl.min(t + n, T)]``): named after the
# builtins on purpose, as the paper writes them; they also accept plain ints.
from timerl.symbolic import smax as max  # noqa: A004
from timerl.symbolic import smin as min  # noqa: A004

if TYPE_CHECKING:
    from timerl import agents
    from timerl import dist as dist
    from timerl import envs as env

# name -> module, imported on first access (PEP 562)
_LAZY = {"env": "timerl.envs", "agents": "timerl.agents", "dist": "timerl.dist"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        globals()[name] = module
        return module
    raise AttributeError(f"module 'timerl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "AutodiffError",
    "BackendError",
    "BoundError",
    "Context",
    "DNNBuilder",
    "DistributedError",
    "EnvNotResetError",
    "MemoryBudgetError",
    "NonAffineIndexError",
    "PDGError",
    "RTDefinitionError",
    "RecurrentTensor",
    "RuntimeExecutionError",
    "ScheduleError",
    "ShapeError",
    "SymbolicError",
    "TimeRLError",
    "UndefinedPointError",
    "agents",
    "as_tensor",
    "bool_",
    "cat",
    "const",
    "empty",
    "dist",
    "env",
    "float32",
    "float64",
    "full",
    "int32",
    "int64",
    "like",
    "log_softmax",
    "max",
    "min",
    "nn",
    "ones",
    "optim",
    "param",
    "rand",
    "randn",
    "run",
    "softmax",
    "stack",
    "udf",
    "where",
    "zeros",
]

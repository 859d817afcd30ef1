"""timerl: deep-RL programs as recurrent tensors, scheduled with isl, run on JAX or PyTorch.

Public API (see ``docs/api.md`` and ``../shared/DESIGN.md`` §2)::

    import timerl as trl
    with trl.Context(num_dims=2) as ((i, I), (t, T)):
        ...
    executor = ctx.compile({I: 10, T: 5}, backend="jax"); executor.execute()
"""

from timerl import envs as env, nn as nn, optim as optim
from timerl.errors import (
    AutodiffError as AutodiffError,
    BackendError as BackendError,
    BoundError as BoundError,
    NonAffineIndexError as NonAffineIndexError,
    PDGError as PDGError,
    RTDefinitionError as RTDefinitionError,
    RuntimeExecutionError as RuntimeExecutionError,
    ScheduleError as ScheduleError,
    ShapeError as ShapeError,
    SymbolicError as SymbolicError,
    TimeRLError as TimeRLError,
    UndefinedPointError as UndefinedPointError,
)
from timerl.nn import DNNBuilder as DNNBuilder
from timerl.rt.context import Context as Context
from timerl.rt.creation import (
    as_tensor as as_tensor,
    bool_ as bool_,
    const as const,
    empty as empty,
    float32 as float32,
    float64 as float64,
    full as full,
    int32 as int32,
    int64 as int64,
    like as like,
    ones as ones,
    param as param,
    rand as rand,
    randn as randn,
    zeros as zeros,
)
from timerl.rt.tensor import (
    RecurrentTensor as RecurrentTensor,
    cat as cat,
    log_softmax as log_softmax,
    softmax as softmax,
    stack as stack,
    where as where,
)
from timerl.rt.udf import udf as udf
from timerl.symbolic import smax as max, smin as min  # noqa: A004

__all__ = [
    "Context", "DNNBuilder", "RecurrentTensor", "TimeRLError", "as_tensor", "cat", "const", "empty",
    "env", "full", "like", "log_softmax", "max", "min", "nn", "ones", "optim", "param", "rand",
    "softmax", "stack", "udf", "where", "zeros",
]

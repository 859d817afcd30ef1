"""timerl: deep-RL programs as recurrent tensors, scheduled with isl, run on JAX or PyTorch.

Public API (see ``docs/api.md``, ``docs/tutorial.md`` and ``docs/architecture.md``)::

    import timerl as trl
    with trl.Context(num_dims=2) as ((i, I), (t, T)):
        ...
    executor = ctx.compile({I: 10, T: 5}, backend="jax"); executor.execute()
"""

from timerl import agents as agents
from timerl import envs as env
from timerl import nn as nn
from timerl import optim as optim
from timerl import run as run
from timerl.errors import (
    AutodiffError as AutodiffError,
)
from timerl.errors import (
    BackendError as BackendError,
)
from timerl.errors import (
    BoundError as BoundError,
)
from timerl.errors import (
    NonAffineIndexError as NonAffineIndexError,
)
from timerl.errors import (
    PDGError as PDGError,
)
from timerl.errors import (
    RTDefinitionError as RTDefinitionError,
)
from timerl.errors import (
    RuntimeExecutionError as RuntimeExecutionError,
)
from timerl.errors import (
    ScheduleError as ScheduleError,
)
from timerl.errors import (
    ShapeError as ShapeError,
)
from timerl.errors import (
    SymbolicError as SymbolicError,
)
from timerl.errors import (
    TimeRLError as TimeRLError,
)
from timerl.errors import (
    UndefinedPointError as UndefinedPointError,
)
from timerl.nn import DNNBuilder as DNNBuilder
from timerl.rt.context import Context as Context
from timerl.rt.creation import (
    as_tensor as as_tensor,
)
from timerl.rt.creation import (
    bool_ as bool_,
)
from timerl.rt.creation import (
    const as const,
)
from timerl.rt.creation import (
    empty as empty,
)
from timerl.rt.creation import (
    float32 as float32,
)
from timerl.rt.creation import (
    float64 as float64,
)
from timerl.rt.creation import (
    full as full,
)
from timerl.rt.creation import (
    int32 as int32,
)
from timerl.rt.creation import (
    int64 as int64,
)
from timerl.rt.creation import (
    like as like,
)
from timerl.rt.creation import (
    ones as ones,
)
from timerl.rt.creation import (
    param as param,
)
from timerl.rt.creation import (
    rand as rand,
)
from timerl.rt.creation import (
    randn as randn,
)
from timerl.rt.creation import (
    zeros as zeros,
)
from timerl.rt.tensor import (
    RecurrentTensor as RecurrentTensor,
)
from timerl.rt.tensor import (
    cat as cat,
)
from timerl.rt.tensor import (
    log_softmax as log_softmax,
)
from timerl.rt.tensor import (
    softmax as softmax,
)
from timerl.rt.tensor import (
    stack as stack,
)
from timerl.rt.tensor import (
    where as where,
)
from timerl.rt.udf import udf as udf
from timerl.symbolic import smax as max  # noqa: A004
from timerl.symbolic import smin as min

__all__ = [
    "Context",
    "DNNBuilder",
    "RecurrentTensor",
    "TimeRLError",
    "agents",
    "as_tensor",
    "cat",
    "const",
    "empty",
    "env",
    "full",
    "like",
    "log_softmax",
    "max",
    "min",
    "nn",
    "ones",
    "optim",
    "param",
    "rand",
    "run",
    "softmax",
    "stack",
    "udf",
    "where",
    "zeros",
]

"""The one exception hierarchy of timerl.

Every error timerl raises on purpose derives from :class:`TimeRLError`. Messages say
what went wrong, where (tensor name or defining line, the point set) and how to fix it.
"""

from __future__ import annotations


class TimeRLError(Exception):
    """Base class of every error timerl raises on purpose."""


class SymbolicError(TimeRLError):
    """A symbolic expression is malformed or cannot be evaluated."""


class NonAffineIndexError(SymbolicError):
    """An index expression is not affine, so it cannot become a Presburger relation."""


class RTDefinitionError(TimeRLError):
    """A recurrent-tensor program is ill-defined (shapes, domains, branching definitions)."""


class ShapeError(RTDefinitionError):
    """Operand shapes do not match."""


class UndefinedPointError(RTDefinitionError):
    """A point of an RT is read but no branching definition covers it."""


class AutodiffError(TimeRLError):
    """Symbolic autodiff cannot differentiate the program."""


class PDGError(TimeRLError):
    """The PDG violates an invariant (raised by the verifier)."""


class ScheduleError(TimeRLError):
    """The program cannot be scheduled (unschedulable cycle, unknown bound)."""


class BoundError(ScheduleError):
    """A dim bound is unknown, inconsistent or needed before it is known."""


class BackendError(TimeRLError):
    """A backend cannot run an op."""


class RuntimeExecutionError(TimeRLError):
    """Execution failed at runtime (for example an environment raised)."""


class EnvNotResetError(RuntimeExecutionError):
    """An environment was stepped before any reset (e.g. a run resumed from a checkpoint whose
    episodes continue across iterations: checkpoints hold the program's values, not the
    environment's own state)."""


class MemoryBudgetError(TimeRLError):
    """The program cannot run within the ``memory_budget`` given to ``ctx.compile``."""


class DistributedError(TimeRLError):
    """Ray is missing, a cluster cannot be reached, or remote runners or farm measurements keep
    failing (``trl.dist``)."""

"""Execution runtime: the AST interpreter, point stores and a schedule-free reference evaluator.

* :class:`Executor` (``interpreter.py``) runs a scheduled PDG on a backend.
* :class:`PointStore` / :class:`MemoryStats` (``store.py``) hold per-point tensors and
  account their bytes.
* :func:`reference_evaluate` (``reference.py``) evaluates a PDG point by point without a
  schedule: the independent check of the interpreter in tests.
"""

from timerl.runtime.interpreter import Executor as Executor
from timerl.runtime.reference import ReferenceEvaluator as ReferenceEvaluator
from timerl.runtime.reference import reference_evaluate as reference_evaluate
from timerl.runtime.store import MemoryStats as MemoryStats
from timerl.runtime.store import PointStore as PointStore

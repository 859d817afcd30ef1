"""TVM MetaSchedule on a RELEASE layer: the comparison of issue 13's deliverable 4.

:func:`tune_layer` hands MetaSchedule (:func:`timerl.envs.looptune.metaschedule.tune_module`:
evolutionary search over its own design space with its XGBoost cost model, for this CPU's
single-core LLVM target) the layer's unscheduled compute (:func:`.template.compute`, the
same ``main(A, B, C)`` the knob template schedules) for ``trials`` measured trials. Its
best schedules are then rebuilt and measured by a :class:`.TemplateMeasurer` (checked
against the NumPy reference, timed by the same rule as every configuration of the knob
tuners), so the GFLOPS are comparable with theirs. MetaSchedule's own runner times each
trial differently (its ``LocalRunner``): ``runner_curve`` (best-so-far GFLOPS per trial
by that runner) shows how fast it got there, on its own scale.

Needs ``pip install 'timerl[metaschedule]'`` (``xgboost-cpu``, ``cloudpickle``,
``psutil``); a missing package is a :class:`TimeRLError`.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from timerl.envs.looptune.tvm_lower import host_target, import_tvm
from timerl.envs.release import template
from timerl.envs.release.measure import TemplateMeasurer
from timerl.envs.release.space import Layer

log = logging.getLogger("timerl.envs.release")


@dataclass(frozen=True)
class LayerTuneResult:
    """MetaSchedule on one layer: ``gflops`` (its best schedules measured as the knob tuners'
    configurations are), ``trials``, ``seconds`` (tuning and re-timing wall time),
    ``runner_gflops`` / ``runner_curve`` (MetaSchedule's own timing: its best, best-so-far
    after each trial), ``setup_seconds`` (one-time import cost)."""

    layer: str
    gflops: float
    trials: int
    seconds: float
    runner_gflops: float
    runner_curve: tuple[float, ...]
    setup_seconds: float


def layer_module(layer: Layer) -> Any:
    """``layer``'s unscheduled compute as an ``IRModule`` with function ``main``."""
    tvm = import_tvm()
    return tvm.IRModule({"main": template.compute(layer)})


def tune_layer(
    layer: Layer,
    trials: int,
    seed: int = 0,
    measurer: TemplateMeasurer | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    trials_per_iter: int = 32,
) -> LayerTuneResult:
    """MetaSchedule on ``layer`` for ``trials`` trials (see the module doc)."""
    from timerl.envs.looptune import metaschedule

    tvm = import_tvm()
    measurer = measurer if measurer is not None else TemplateMeasurer()
    target = host_target()

    def time_fn(mod: Any) -> float:
        try:
            return measurer.time_lib(layer, tvm.compile(mod, target=target).jit())
        except Exception as exc:  # a schedule that fails to build or computes a wrong result
            log.warning("MetaSchedule schedule for %s is invalid: %s", layer.name, exc)
            return 0.0

    res = metaschedule.tune_module(
        layer_module(layer),
        layer.name,
        layer.flops,
        time_fn,
        trials=trials,
        trials_per_iter=trials_per_iter,
        seed=seed,
        work_dir=work_dir,
    )
    return LayerTuneResult(
        layer.name,
        res.gflops,
        res.trials,
        res.seconds,
        res.runner_gflops,
        res.runner_curve,
        res.setup_seconds,
    )

"""TVM MetaSchedule baseline for LoopTune's matmuls (paper §VI-D, Fig. 11).

:func:`tune` tunes ``C = A @ B`` (float32, row-major, the same TE definition as the
env's lowering) with ``tvm.s_tir.meta_schedule.tune_tir``: evolutionary search with
the XGBoost cost model, ``trials`` measured candidates (64, as in the paper), for this
CPU's single-core LLVM target (:func:`.tvm_lower.host_target`, the env's target). The
``top_k`` best candidates are then rebuilt and timed here like the env's
:class:`~.measure.TVMMeasurer` does (checked against NumPy, ``time_evaluator``, min
over 5 repeats of ~5 ms), three times each as :class:`.evaluate.BestOf` measures the
other methods, and the best is returned.

Fixes this needs on TVM 0.27 (``shared/notes/loop_envs.md``):

- ``apache-tvm-ffi==0.1.14.post1`` (0.1.15.x segfaults in every ``TuneContext``) and the
  packages the wheel leaves out: ``xgboost``, ``cloudpickle``, ``psutil``
  (``pip install 'timerl[metaschedule]'``, whose ``xgboost-cpu`` wheel provides the
  ``xgboost`` module without the ~0.5 GB of GPU libraries of the ``xgboost`` wheel);
- builders use :func:`_fast_build`, the default build without its
  ``import tvm.s_tir.tensor_intrin``; that import registers the tensor intrinsics of
  every target and takes 35-120 s here (the CUDA ones dominate), more than the
  builder's 30 s timeout. For the same reason this process registers only the x86
  intrinsics (:func:`_register_cpu_intrinsics`), which is all an x86 LLVM target can
  use, before ``TuneContext`` imports the whole package. A process that needs the
  other targets' intrinsics must import ``tvm.s_tir.tensor_intrin`` before calling
  :func:`tune`;
- tuned kernels contain ``T.parallel``: they are timed single-threaded
  (``TVM_NUM_THREADS=1``, which :func:`.tvm_lower.import_tvm` sets unless it is set
  already; the runner's worker processes inherit it);
- every trial leaves an empty temp folder: ``TMPDIR`` points into the work dir while
  tuning.

About 1-2 minutes per problem for 64 trials on a 2-core machine: opt-in in the CLI.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from timerl.envs.looptune import tvm_lower
from timerl.envs.looptune.ir import Problem
from timerl.envs.looptune.measure import problem_inputs, reduction_size
from timerl.errors import TimeRLError

__all__ = ["MetaScheduleResult", "ModuleTuneResult", "metaschedule_tuner", "tune", "tune_module"]

log = logging.getLogger(__name__)

DEFAULT_TRIALS = 64
_REPEATS = 5
_REPEAT_S = 5e-3
_TIMINGS = 3  # independent timings per candidate, best kept (as evaluate.BestOf does)


@dataclass(frozen=True)
class MetaScheduleResult:
    """Outcome of :func:`tune`.

    **Fields:** ``gflops`` (best of the top candidates, timed here single-threaded),
    ``seconds`` (tuning wall time, re-timing included; the one-time setup of the
    process is not), ``trials`` (candidates MetaSchedule measured), ``runner_gflops``
    (MetaSchedule's own figure for its best candidate), ``setup_seconds`` (the one-time
    setup this call paid: importing TVM and registering intrinsics; 0 after the first).
    """

    problem: Problem
    gflops: float
    seconds: float
    trials: int
    runner_gflops: float
    setup_seconds: float


def _import_meta_schedule() -> Any:
    tvm_lower.import_tvm()
    missing = [m for m in ("xgboost", "cloudpickle", "psutil") if importlib.util.find_spec(m) is None]
    if missing:
        raise TimeRLError(
            f"MetaSchedule needs {', '.join(missing)}: pip install 'timerl[metaschedule]' "
            "(or pip install xgboost-cpu==3.2.0 cloudpickle psutil)"
        )
    from tvm.s_tir import meta_schedule

    return meta_schedule


def _register_cpu_intrinsics() -> None:
    """Register TVM's x86 tensor intrinsics without importing the whole (slow) package.

    ``TuneContext`` runs ``import tvm.s_tir.tensor_intrin``, whose ``__init__`` imports
    the intrinsics of CUDA, ROCm, Hexagon, ARM, ... (35-120 s). If that package is not
    imported yet, put an un-executed module object for it in ``sys.modules`` (so the
    later import is a no-op) and import only its ``x86`` submodule.
    """
    name = "tvm.s_tir.tensor_intrin"
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None:
        raise TimeRLError(f"{name} not found: reinstall apache-tvm==0.27.0.post1")
    sys.modules[name] = importlib.util.module_from_spec(spec)
    importlib.import_module(f"{name}.x86")


def _fast_build(mod: Any, target: Any, _params: Any) -> Any:
    """MetaSchedule's ``default_build`` minus its ``import tvm.s_tir.tensor_intrin``.

    Runs in builder worker processes: it is a module-level function, pickled by
    reference, so workers import this module (which imports no TVM at load time).
    Returns a runtime ``Module`` (what the exporter expects), not ``tvm.compile``'s
    ``Executable``.
    """
    from tvm.driver import build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return build(mod, target=target)


def matmul_module(problem: Problem) -> Any:
    """``main(A, B, C)``: ``C[i, j] = sum_k A[i, k] * B[k, j]`` in float32, as an IRModule."""
    tvm = tvm_lower.import_tvm()
    from tvm import te

    if problem.kernel.name != "mm":
        raise TimeRLError(f"MetaSchedule is only wired up for matmul here, not {problem.kernel.name}")
    m, n, k = (problem.extent(d) for d in "mnk")
    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="k")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


@contextlib.contextmanager
def _scratch_tmpdir(path: str) -> Iterator[None]:
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old


def _time_module(mod: Any, problem: Problem, target: Any) -> float:
    """GFLOPS of a scheduled module, checked against NumPy; 0.0 if it fails."""
    tvm = tvm_lower.import_tvm()
    p = problem
    try:
        lib = tvm.compile(mod, target=target).jit()
        dev = tvm.cpu(0)
        a, b, ref = problem_inputs(p)
        ta, tb = tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev)
        tc = tvm.runtime.tensor(np.full(ref.shape, np.nan, np.float32), dev)
        start = time.perf_counter()
        lib["main"](ta, tb, tc)
        once = time.perf_counter() - start
        if not np.allclose(tc.numpy(), ref, rtol=1e-4, atol=1e-5 * reduction_size(p)):
            log.warning("MetaSchedule candidate for %s computes a wrong result; skipped", p.name)
            return 0.0
        if once >= _REPEAT_S:
            number, repeat = 1, 3
        else:
            number, repeat = max(1, int(_REPEAT_S / max(once, 1e-7))), _REPEATS
        timer = lib.time_evaluator("main", dev, number=number, repeat=repeat)
        best = min(min(timer(ta, tb, tc).results) for _ in range(_TIMINGS))
        return p.flops / best / 1e9
    except Exception as exc:  # a candidate that fails to build or run is not a result
        log.warning("MetaSchedule candidate for %s failed: %s", p.name, exc)
        return 0.0


@dataclass(frozen=True)
class ModuleTuneResult:
    """Outcome of :func:`tune_module`: as :class:`MetaScheduleResult` (without the problem),
    plus ``runner_curve``: the best GFLOPS by MetaSchedule's own runner after each trial, in
    trial order (:func:`_runner_curve`)."""

    gflops: float
    seconds: float
    trials: int
    runner_gflops: float
    setup_seconds: float
    runner_curve: tuple[float, ...]


def _runner_curve(path: str, flops: float) -> tuple[float, ...]:
    """Best-so-far GFLOPS by MetaSchedule's runner after each trial, in trial order: the JSON
    database appends one line ``[workload, [trace, run_secs, target, args]]`` per committed
    trial (its in-memory records are sorted by speed, not by trial). A failed trial (no run
    seconds, or MetaSchedule's 1e10 s marker) counts 0."""
    if not os.path.exists(path):
        raise TimeRLError(f"MetaSchedule's tuning records are not where expected: {path}")
    per_trial = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            secs = json.loads(line)[1][1] or []
            ok = bool(secs) and all(0 < float(x) < 1e9 for x in secs)
            per_trial.append(flops / float(np.mean([float(x) for x in secs])) / 1e9 if ok else 0.0)
    return tuple(float(x) for x in np.maximum.accumulate(per_trial)) if per_trial else ()


def tune_module(
    mod: Any,
    name: str,
    flops: float,
    time_fn: Callable[[Any], float],
    *,
    trials: int = DEFAULT_TRIALS,
    trials_per_iter: int = 32,
    top_k: int = 3,
    seed: int = 0,
    builder_workers: int = 2,
    work_dir: str | os.PathLike[str] | None = None,
) -> ModuleTuneResult:
    """Tune the ``IRModule`` ``mod`` (function ``main``, ``flops`` per call) with MetaSchedule
    for ``trials`` trials; the ``top_k`` best schedules are passed to ``time_fn`` (scheduled
    module -> GFLOPS, 0.0 for a failure: it checks the result and times it the caller's way)
    and the best is returned (see the module doc). ``name`` is for messages.

    ``work_dir``: where MetaSchedule keeps its database and logs (a temporary folder,
    removed afterwards, by default). ``builder_workers``: parallel LLVM builds.
    """
    if trials < 1 or trials_per_iter < 1 or top_k < 1:
        raise TimeRLError(
            f"need trials, trials_per_iter, top_k >= 1, got {trials}, {trials_per_iter}, {top_k}"
        )
    if os.environ.get("TVM_NUM_THREADS", "1") != "1":
        log.warning(
            "TVM_NUM_THREADS=%s: MetaSchedule kernels are parallel, so they are not timed "
            "single-threaded as the env's are; unset it or set TVM_NUM_THREADS=1",
            os.environ["TVM_NUM_THREADS"],
        )
    setup_start = time.perf_counter()
    ms = _import_meta_schedule()
    _register_cpu_intrinsics()
    setup = time.perf_counter() - setup_start
    tvm = tvm_lower.import_tvm()
    target = tvm_lower.host_target()
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        root = str(work_dir) if work_dir is not None else stack.enter_context(tempfile.TemporaryDirectory())
        scratch = os.path.join(root, "tmp")
        os.makedirs(scratch, exist_ok=True)
        stack.enter_context(_scratch_tmpdir(scratch))
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        database = ms.tune_tir(
            mod,
            target,
            root,
            max_trials_global=trials,
            num_trials_per_iter=min(trials_per_iter, trials),
            builder=ms.builder.LocalBuilder(f_build=_fast_build, max_workers=builder_workers),
            runner=ms.runner.LocalRunner(
                evaluator_config=ms.runner.EvaluatorConfig(number=3, min_repeat_ms=20)
            ),
            num_tuning_cores=1,
            seed=seed,
        )
        workload = database.commit_workload(mod)
        records = database.get_top_k(workload, top_k)
        all_records = database.get_all_tuning_records()
        if not records:
            raise TimeRLError(
                f"MetaSchedule found no valid schedule for {name} in {trials} trials: see the "
                f"logs in work_dir (pass work_dir=... to keep them) or raise trials"
            )
        runner_secs = [float(np.mean([float(s) for s in r.run_secs])) for r in records]
        curve = _runner_curve(os.path.join(root, "database_tuning_record.json"), flops)
        best = 0.0
        for record in records:
            sch = tvm.s_tir.Schedule(workload.mod)
            record.trace.apply_to_schedule(sch, remove_postproc=False)
            best = max(best, time_fn(sch.mod))
    seconds = time.perf_counter() - start
    runner_gflops = flops / min(runner_secs) / 1e9 if min(runner_secs) > 0 else math.nan
    log.info(
        "MetaSchedule %s: %.1f GFLOPS (runner %.1f) after %d trials in %.0f s (+%.0f s setup)",
        name,
        best,
        runner_gflops,
        len(all_records),
        seconds,
        setup,
    )
    return ModuleTuneResult(best, seconds, len(all_records), runner_gflops, setup, curve)


def tune(
    problem: Problem,
    *,
    trials: int = DEFAULT_TRIALS,
    trials_per_iter: int = 32,
    top_k: int = 3,
    seed: int = 0,
    builder_workers: int = 2,
    work_dir: str | os.PathLike[str] | None = None,
) -> MetaScheduleResult:
    """Tune ``problem``'s matmul with MetaSchedule for ``trials`` trials (see the module doc
    and :func:`tune_module`)."""
    target = tvm_lower.host_target()
    res = tune_module(
        matmul_module(problem),
        problem.name,
        problem.flops,
        lambda mod: _time_module(mod, problem, target),
        trials=trials,
        trials_per_iter=trials_per_iter,
        top_k=top_k,
        seed=seed,
        builder_workers=builder_workers,
        work_dir=work_dir,
    )
    return MetaScheduleResult(
        problem, res.gflops, res.seconds, res.trials, res.runner_gflops, res.setup_seconds
    )


def metaschedule_tuner(
    trials: int = DEFAULT_TRIALS, **kwargs: Any
) -> Callable[[Problem], tuple[float, float]]:
    """A tuner for :func:`timerl.envs.looptune.evaluate.evaluate`: ``problem -> (GFLOPS, seconds)``."""

    def run(problem: Problem) -> tuple[float, float]:
        result = tune(problem, trials=trials, **kwargs)
        return result.gflops, result.seconds

    return run

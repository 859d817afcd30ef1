"""GFLOPS of a LoopTune state: compile-and-time with TVM, or an analytic model for tests.

- :class:`TVMMeasurer` lowers a state (:mod:`.tvm_lower`), builds it with LLVM for this
  CPU (without the checks of the arguments, which it passes itself: the same kernel code,
  about 40 % less compile time), checks the result against NumPy once per compiled
  schedule, then times it single-threaded (min over repeats). Results are cached in
  memory and, optionally, in a JSON-lines file per machine (``~/.cache/timerl/looptune/``).
- :class:`~timerl.envs.looptune.analytic.AnalyticCostModel` (re-exported here): a
  deterministic estimate for CI tests only.
- :func:`machine_peak`: the reward's denominator, measured once per machine and cached.
- :func:`numpy_gflops`: the NumPy (OpenBLAS) baseline, single-threaded.

Measurers cache by :attr:`LoopState.schedule_key` (the state key without the cursor):
states that differ only by the cursor run the same code, so ``up``/``down`` get exactly
zero reward. The TVM measurer times the :func:`~.ir.canonical` form of a state (loops
of one dim directly inside each other merged: the same iterations in the same order),
so a split that leaves its two loops adjacent also measures exactly as before. A schedule that fails to build, or computes a wrong result, measures
0.0 GFLOPS and is logged as a warning (it is never rewarded). :meth:`TVMMeasurer.gflops_many`
(:func:`gflops_all` for any measurer) measures the states of a whole episode at once: each
new schedule key built once, all in one module (one TVM pass pipeline and one LLVM JIT),
which the policy's tuning (:func:`timerl.looptune.tune`) uses.

Timing rules (``shared/notes/loop_envs.md``): one measuring process at a time on a small
machine; single thread; min of >= 3 repeats. Per state, about 60-120 ms of TVM + LLVM
(build and JIT) and a timing budget of ``repeats * repeat_ms`` (default 20 x 1 ms); a
kernel slower than ``repeat_ms`` runs once per repeat, as many times as fit the budget
(at least ``min_repeats``). Many short repeats matter on a shared machine: with 3 busy
processes on 2 cores, 5 repeats of 5 ms measured about half the speed that 20 repeats of
1 ms did (the best short repeat is the one that ran undisturbed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from timerl.envs.looptune import tvm_lower
from timerl.envs.looptune.analytic import AnalyticCostModel
from timerl.envs.looptune.ir import LoopState, Problem, canonical
from timerl.envs.looptune.kernels import einsum_reference, has_numpy_baseline, numpy_reference
from timerl.errors import TimeRLError

__all__ = [
    "AnalyticCostModel",
    "Measurer",
    "MeasureStats",
    "TVMMeasurer",
    "best_seconds",
    "default_cache_dir",
    "gflops_all",
    "machine_peak",
    "make_measurer",
    "numpy_gflops",
    "numpy_gflops_batch",
]

log = logging.getLogger("timerl.envs.looptune")

SCREEN_REPEATS = 5  # TVMMeasurer.gflops_many: timed repeats of each new schedule at first
SCREEN_KEEP = 0.8  # ... then the rest of the budget for those within this of the fastest


class Measurer(Protocol):
    """Anything that gives the GFLOPS of a state (cached by its schedule key)."""

    name: str

    def gflops(self, state: LoopState) -> float: ...


def gflops_all(measurer: Measurer, states: Sequence[LoopState]) -> list[float]:
    """``measurer.gflops`` of each of ``states``; a measurer with ``gflops_many`` (the TVM
    measurer: each new schedule built once, all in one module) measures them together."""
    many = getattr(measurer, "gflops_many", None)
    return list(many(states)) if many is not None else [measurer.gflops(s) for s in states]


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/timerl/looptune`` (``~/.cache/timerl/looptune`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "timerl" / "looptune"


@dataclass
class MeasureStats:
    """Counters of a measurer (for logs and reports); times in seconds."""

    measured: int = 0
    memory_hits: int = 0
    disk_hits: int = 0
    failures: int = 0
    compile_s: list[float] = field(default_factory=list)  # TVM lowering + LLVM build + JIT
    total_s: list[float] = field(default_factory=list)


class _DiskCache:
    """An append-only JSON-lines file ``{"key": ..., "gflops": ...}``: loaded whole at start,
    one line appended per new measurement (appends of short lines do not interleave).

    A line that is not such a record, or whose GFLOPS is not a finite number >= 0 (0 marks a
    schedule that failed), is corrupt: it is reported (one warning with the count) and the
    file is rebuilt from the valid lines, so its schedules are measured again, never trusted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[str, float] = {}
        self.corrupt = 0
        if not path.exists():
            return
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError as exc:
            log.warning("cannot read the LoopTune cache %s (%s): measuring again", path, exc)
            return
        for line in lines:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                key, value = str(rec["key"]), float(rec["gflops"])
                if not isinstance(rec["key"], str) or not math.isfinite(value) or value < 0:
                    raise ValueError(line)
            except (ValueError, KeyError, TypeError):
                self.corrupt += 1
                continue
            self.values[key] = value
        if self.corrupt:
            log.warning(
                "LoopTune cache %s: %d corrupt line(s) dropped (%d valid kept); rebuilding the file, "
                "the dropped schedules will be measured again",
                path,
                self.corrupt,
                len(self.values),
            )
            self._rewrite()

    def _rewrite(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            tmp.write_text(
                "".join(json.dumps({"key": k, "gflops": v}) + "\n" for k, v in self.values.items())
            )
            os.replace(tmp, self.path)
        except OSError as exc:
            log.warning("cannot rebuild the LoopTune cache %s (%s)", self.path, exc)

    def add(self, key: str, value: float) -> None:
        self.values[key] = value
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"key": key, "gflops": value}) + "\n")
        except OSError as exc:
            log.warning("cannot write the LoopTune cache %s (%s): results stay in memory", self.path, exc)


def problem_inputs(p: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fixed random operands in [-1, 1) (float32, seeded by the problem) and the float64
    NumPy reference result (:func:`.kernels.numpy_reference`, ``A @ B`` for matmul; the
    brute-force :func:`.kernels.einsum_reference` for kernels defined by the user)."""
    k, ext = p.kernel, p.extents
    rng = np.random.default_rng([*p.sizes, sum(map(ord, k.name))])
    a = rng.uniform(-1.0, 1.0, k.lhs.shape(ext)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, k.rhs.shape(ext)).astype(np.float32)
    if not has_numpy_baseline(k):
        return a, b, einsum_reference(k, a, b, ext)
    return a, b, numpy_reference(k)(a.astype(np.float64), b.astype(np.float64))


def reduction_size(p: Problem) -> int:
    """Products summed into each output element (the check's tolerance grows with it)."""
    return math.prod(p.extent(d) for d in p.kernel.reduction_dims)


class TVMMeasurer:
    """Compile-and-time through TVM + LLVM on this CPU (see the module doc).

    **Arguments:**

    - ``cache_dir``: folder of the disk cache (default :func:`default_cache_dir`); the file
      is named by the CPU, TVM version and lowering options.
    - ``disk_cache``: ``False`` keeps results in memory only.
    - ``repeats`` / ``min_repeats`` / ``repeat_ms``: timing budget (fast kernels run
      ``repeats`` timed repeats of about ``repeat_ms`` each; slow ones single runs, as
      many as fit ``repeats * repeat_ms`` but at least ``min_repeats``); the result is
      the fastest repeat.
    - ``max_lanes`` / ``unroll_max_step``: lowering options (:func:`.tvm_lower.lower`).
    """

    name = "tvm"

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        disk_cache: bool = True,
        repeats: int = 20,
        min_repeats: int = 3,
        repeat_ms: float = 1.0,
        max_lanes: int = 64,
        unroll_max_step: int = 0,
    ) -> None:
        if min_repeats < 3 or repeats < min_repeats:
            raise TimeRLError(f"need repeats >= min_repeats >= 3, got {repeats}, {min_repeats}")
        tvm = tvm_lower.import_tvm()
        self.tvm = tvm
        self.cpu = tvm_lower.host_cpu()
        self.target = tvm_lower.host_target()
        self.dev = tvm.cpu(0)
        self.repeats, self.min_repeats, self.repeat_ms = repeats, min_repeats, repeat_ms
        self.max_lanes, self.unroll_max_step = max_lanes, unroll_max_step
        self.stats = MeasureStats()
        self._mem: dict[str, float] = {}
        self._inputs: dict[Problem, tuple[Any, Any, np.ndarray]] = {}
        self.disk: _DiskCache | None = None
        cfg = f"{tvm.__version__}|v{tvm_lower.LOWERING_VERSION}|lanes{max_lanes}|unroll{unroll_max_step}"
        tag = hashlib.sha1(cfg.encode()).hexdigest()[:10]
        self.cache_file_name = f"tvm-{self.cpu}-{tag}.jsonl"  # by CPU, TVM version, lowering options
        if disk_cache:
            folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            self.disk = _DiskCache(folder / self.cache_file_name)
            log.info("LoopTune TVM cache %s (%d entries)", self.disk.path, len(self.disk.values))

    def machine_peak(self, cache_dir: str | os.PathLike[str] | None = None) -> float:
        """:func:`machine_peak` of the machine this measurer runs on (a farm worker's: the
        denominator of rewards measured there)."""
        return machine_peak(cache_dir)

    def gflops(self, state: LoopState) -> float:
        state = canonical(state)  # directly nested loops of one dim: one loop, one measurement
        key = state.schedule_key
        if key in self._mem:
            self.stats.memory_hits += 1
            return self._mem[key]
        if self.disk is not None and key in self.disk.values:
            self.stats.disk_hits += 1
            self._mem[key] = self.disk.values[key]
            return self._mem[key]
        try:
            value = self._measure(state)
        except Exception as exc:  # any failure of TVM/LLVM or the check: never rewarded
            return self._failed(key, exc)
        return self._record(key, value)

    def gflops_many(self, states: Sequence[LoopState]) -> list[float]:
        """:meth:`gflops` of each of ``states`` (the same values and caches), building the
        schedules not measured yet together: each schedule key (of the :func:`~.ir.canonical`
        form) once, all of them in one module (:func:`.tvm_lower.build_many`: one TVM pass
        pipeline and one LLVM JIT, about 15 ms less per schedule), then each checked against
        NumPy. Timing is screened: each runs :data:`SCREEN_REPEATS` timed repeats first, and
        only those within :data:`SCREEN_KEEP` of the fastest (the ones the choice is between)
        run the rest of the ``repeats`` (as many as :meth:`gflops` gives a schedule, or
        more); the others keep their screening figure, in memory only (never in the disk
        cache). If the module fails to build, each schedule is built alone, so only the
        one that fails measures 0."""
        canon = [canonical(s) for s in states]
        todo: dict[str, LoopState] = {}
        for s in canon:
            key = s.schedule_key
            if key not in self._mem and (self.disk is None or key not in self.disk.values):
                todo.setdefault(key, s)
        fresh = self._measure_together(todo) if len(todo) > 1 else {}
        return [fresh.pop(s.schedule_key) if s.schedule_key in fresh else self.gflops(s) for s in canon]

    def _failed(self, key: str, exc: Exception) -> float:
        self.stats.failures += 1
        log.warning("LoopTune: measuring %s failed, counted as 0 GFLOPS: %s", key, exc)
        self._mem[key] = 0.0
        return 0.0

    def _record(self, key: str, value: float, disk: bool = True) -> float:
        self._mem[key] = value
        if self.disk is not None and disk:
            self.disk.add(key, value)
        return value

    def _measure_together(self, todo: Mapping[str, LoopState]) -> dict[str, float]:
        """Build ``todo``'s states in one module, check each against NumPy, then time them
        (see :meth:`gflops_many`); ``{}`` when the module fails to build."""
        t0 = time.perf_counter()
        try:
            ex, names = tvm_lower.build_many(
                list(todo.values()), self.target, self.max_lanes, self.unroll_max_step, checks=False
            )
            lib = ex.jit()
            for name in names:
                lib[name]  # LLVM's machine-code generation (the JIT) happens here
        except Exception as exc:
            log.info(
                "LoopTune: building %d schedules in one module failed (%s): building each alone",
                len(todo),
                exc,
            )
            return {}
        build_s = (time.perf_counter() - t0) / len(todo)  # each schedule's share
        out: dict[str, float] = {}
        runs: dict[str, tuple[LoopState, str, tuple[Any, ...], float]] = {}
        for (key, state), name in zip(todo.items(), names, strict=True):
            try:
                args, once = self._check(state, lib, name)
            except Exception as exc:  # a wrong result: never rewarded
                out[key] = self._failed(key, exc)
                continue
            runs[key] = (state, name, args, once)
        # screening: SCREEN_REPEATS repeats each, the rest of the budget for the contenders only
        screen = len(runs) > 1 and self.repeats > SCREEN_REPEATS
        first = SCREEN_REPEATS if screen else self.repeats
        best: dict[str, float] = {}
        spent: dict[str, float] = {}
        for key, (_, name, args, once) in runs.items():
            t1 = time.perf_counter()
            best[key] = self._time(lib, name, args, once, first, min(first, self.min_repeats))
            spent[key] = time.perf_counter() - t1
        fastest = min(best.values(), default=0.0)
        full = {key: not screen or best[key] <= fastest / SCREEN_KEEP for key in runs}
        for key, (state, name, args, once) in runs.items():
            if screen and full[key]:
                t1 = time.perf_counter()
                more = self._time(lib, name, args, once, self.repeats - first, self.min_repeats)
                best[key] = min(best[key], more)
                spent[key] += time.perf_counter() - t1
            gf = self._done(state, build_s, spent[key], best[key])
            out[key] = self._record(key, gf, disk=full[key])  # a screened-out value: memory only
        return out

    def _arrays(self, p: Problem) -> tuple[Any, Any, np.ndarray]:
        if p not in self._inputs:
            a, b, ref = problem_inputs(p)
            rt = self.tvm.runtime
            self._inputs[p] = (rt.tensor(a, self.dev), rt.tensor(b, self.dev), ref)
        return self._inputs[p]

    def _measure(self, state: LoopState) -> float:
        t0 = time.perf_counter()
        lib = tvm_lower.build(state, self.target, self.max_lanes, self.unroll_max_step, checks=False).jit()
        lib["main"]  # LLVM's machine-code generation (the JIT) happens here
        build_s = time.perf_counter() - t0
        args, once = self._check(state, lib, "main")
        best = self._time(lib, "main", args, once, self.repeats, self.min_repeats)
        return self._done(state, build_s, time.perf_counter() - t0 - build_s, best)

    def _check(self, state: LoopState, lib: Any, name: str) -> tuple[tuple[Any, ...], float]:
        """Run function ``name`` of the built ``lib`` (``state``'s schedule) once and check
        its result against NumPy; its arguments and the seconds of that run."""
        p = state.problem
        fn = lib[name]
        a, b, ref = self._arrays(p)
        c = self.tvm.runtime.tensor(np.full(ref.shape, np.nan, np.float32), self.dev)
        t0 = time.perf_counter()
        fn(a, b, c)  # the check run also warms the caches
        once = time.perf_counter() - t0
        out = c.numpy()
        if not np.allclose(out, ref, rtol=1e-4, atol=1e-5 * reduction_size(p)):
            bad = float(np.nanmax(np.abs(out - ref))) if np.isfinite(out).any() else float("nan")
            raise TimeRLError(f"wrong result (max abs error {bad:.3g}): a lowering bug, please report it")
        return (a, b, c), once

    def _time(
        self, lib: Any, name: str, args: tuple[Any, ...], once: float, repeats: int, min_repeats: int
    ) -> float:
        return best_seconds(lib, self.dev, args, once, repeats, min_repeats, self.repeat_ms, name=name)

    def _done(self, state: LoopState, build_s: float, run_s: float, best: float) -> float:
        """``state``'s GFLOPS from its best seconds per call; counts and logs the measurement
        (``build_s``: compiling, ``run_s``: checking and timing)."""
        total = build_s + run_s
        self.stats.measured += 1
        self.stats.compile_s.append(build_s)
        self.stats.total_s.append(total)
        gf = state.problem.flops / best / 1e9
        if total > 1.0:
            log.info(
                "LoopTune: %s was slow to measure: build %.2f s, total %.2f s",
                state.schedule_key,
                build_s,
                total,
            )
        log.debug(
            "LoopTune: %s %.2f GFLOPS (build %.0f ms, total %.0f ms)",
            state.key,
            gf,
            1e3 * build_s,
            1e3 * total,
        )
        return gf


def timing_plan(once: float, repeats: int, min_repeats: int, repeat_ms: float) -> tuple[int, int]:
    """``(calls per repeat, repeats)`` of the timing rule (:func:`best_seconds`): a kernel
    faster than ``repeat_ms`` (``once``: the seconds of one untimed call) runs ``repeats``
    repeats of about ``repeat_ms`` each; a slower one single calls, as many as fit
    ``repeats * repeat_ms`` but at least ``min_repeats``."""
    if once * 1e3 < repeat_ms:
        return max(1, int(repeat_ms * 1e-3 / max(once, 1e-7))), repeats
    budget_s = repeats * repeat_ms * 1e-3
    return 1, max(min_repeats, min(repeats, int(budget_s / once)))


def best_seconds(
    lib: Any,
    dev: Any,
    args: tuple[Any, ...],
    once: float,
    repeats: int,
    min_repeats: int,
    repeat_ms: float,
    name: str = "main",
) -> float:
    """The fastest of ``repeats`` timed repeats of ``lib[name](*args)`` in seconds per call
    (the timing rule of :class:`TVMMeasurer`, shared with other TVM measurers): a kernel
    faster than ``repeat_ms`` (``once``: the seconds of one untimed call) runs ``repeats``
    repeats of about ``repeat_ms`` each; a slower one runs single calls, as many as fit
    ``repeats * repeat_ms`` but at least ``min_repeats``."""
    number, repeat = timing_plan(once, repeats, min_repeats, repeat_ms)
    timer = lib.time_evaluator(name, dev, number=number, repeat=repeat)
    return float(min(timer(*args).results))


def make_measurer(spec: str | Measurer, cache_dir: str | os.PathLike[str] | None = None) -> Measurer:
    """``"tvm"`` -> :class:`TVMMeasurer`, ``"analytic"`` -> :class:`AnalyticCostModel`, or a
    measurer object as is."""
    if not isinstance(spec, str):
        return spec
    if spec == "tvm":
        return TVMMeasurer(cache_dir=cache_dir)
    if spec == "analytic":
        return AnalyticCostModel()
    raise TimeRLError(f"unknown LoopTune measurer {spec!r}; use 'tvm', 'analytic' or a Measurer object")


# --- baselines: NumPy and the machine peak (in a child process, single-threaded) -------

_NUMPY_SCRIPT = """
import json, sys, time
import numpy as np
from timerl.envs.looptune.kernels import kernel, numpy_reference
out = []
for name, sizes, repeats in json.loads(sys.argv[1]):
    k = kernel(name)
    ext = dict(zip(k.dims, sizes))
    rng = np.random.default_rng(0)
    a = rng.random(k.lhs.shape(ext), dtype=np.float32); b = rng.random(k.rhs.shape(ext), dtype=np.float32)
    fn = numpy_reference(k)
    if name in ("mm", "bmm"):  # into a preallocated output, as a tuned kernel writes C
        c = fn(a, b)
        run = lambda: np.matmul(a, b, out=c)
    else:
        run = lambda: fn(a, b)
    run()
    t = time.perf_counter(); run(); once = time.perf_counter() - t
    number = max(1, int(0.001 / max(once, 1e-7)))
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(number):
            run()
        best = min(best, (time.perf_counter() - t) / number)
    flops = 2.0
    for s in sizes:
        flops *= s
    out.append(flops / best / 1e9)
print(json.dumps(out))
"""


def _numpy_child(problems: list[Problem], repeats: int) -> list[float]:
    """GFLOPS of each problem's NumPy baseline (:func:`.kernels.numpy_reference`), timed
    in a child Python whose OpenBLAS is limited to one thread (the variable only works
    before NumPy loads, and this process's NumPy is loaded already)."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)  # the child imports .kernels
    arg = json.dumps([[p.kernel.name, list(p.sizes), repeats] for p in problems])
    try:
        res = subprocess.run(
            [sys.executable, "-c", _NUMPY_SCRIPT, arg], env=env, capture_output=True, text=True, check=True
        )
    except subprocess.CalledProcessError as exc:
        raise TimeRLError(f"timing NumPy in a child process failed: {exc.stderr.strip()[-500:]}") from exc
    return [float(x) for x in json.loads(res.stdout)]


def numpy_gflops(problem: Problem, repeats: int = 20) -> float:
    """Single-threaded NumPy (OpenBLAS) GFLOPS of ``problem``: best of ``repeats`` repeats
    of ~1 ms each (short repeats: the best one is more likely undisturbed on a shared
    machine), in a child process with ``OPENBLAS_NUM_THREADS=1``. Matmuls write into a
    preallocated output; convolutions time im2col plus the matmul."""
    return _numpy_child([problem], repeats)[0]


def numpy_gflops_batch(problems: list[Problem], repeats: int = 20) -> list[float]:
    """:func:`numpy_gflops` of many problems in one child process (one start-up cost)."""
    return _numpy_child(list(problems), repeats) if problems else []


def _peak_kernel_gflops(measurer: TVMMeasurer) -> float:
    """The best of a few register-tiled TVM kernels (``m/4`` under ``k``, ``n`` vectorized
    by 16 or 32; 64^3 and 128^3 fit in L2), the fastest schedules we know for this IR."""
    from timerl.envs.looptune.ir import ACTIONS, apply_action, initial_state

    best = 0.0
    for size in (64, 128):
        for lanes in ("split_16", "split_32"):
            s = initial_state(Problem(size, size, size))
            for a in ("split_4", "down", "swap_down", "down", lanes):
                s = apply_action(s, ACTIONS.index(a))
            best = max(best, measurer.gflops(s))
    return best


def machine_peak(cache_dir: str | os.PathLike[str] | None = None, refresh: bool = False) -> float:
    """Empirical single-thread peak GFLOPS of this machine (float32): the best of NumPy
    matmuls of 256..1024 and of register-tiled TVM kernels. Measured once (about 10 s;
    measure on a quiet machine: the value normalises every reward), then read from
    ``<cache_dir>/peak.json`` (keyed by CPU); ``refresh=True`` measures again."""
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    cpu = tvm_lower.host_cpu()
    path = folder / "peak.json"
    known: dict[str, float] = {}
    if path.exists():
        try:
            known = {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
            bad = [k for k, v in known.items() if not (math.isfinite(v) and v > 0)]
            if bad:
                raise ValueError(f"not a positive GFLOPS for {bad}")
        except (ValueError, AttributeError, TypeError) as exc:
            log.warning("the LoopTune peak cache %s is corrupt (%s): measuring the peak again", path, exc)
            known = {}
            refresh = True
    if cpu in known and not refresh:
        return known[cpu]
    log.info("LoopTune: measuring this machine's single-thread peak (once, cached in %s)", path)
    np_best = max(_numpy_child([Problem(n, n, n) for n in (256, 512, 1024)], 20))
    tvm_best = _peak_kernel_gflops(TVMMeasurer(disk_cache=False, repeats=50))
    best = max(np_best, tvm_best)
    log.info("LoopTune: NumPy best %.1f GFLOPS, TVM kernels best %.1f GFLOPS", np_best, tvm_best)
    known[cpu] = best
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(known, indent=1))
    log.info("LoopTune: peak %.1f GFLOPS on %s", best, cpu)
    return best


def summarize(values: list[float]) -> str:
    """``median / max`` in ms of a list of seconds (for logs)."""
    if not values:
        return "n/a"
    v = sorted(values)
    return f"median {1e3 * v[len(v) // 2]:.0f} ms, max {1e3 * v[-1]:.0f} ms (n={len(v)})"

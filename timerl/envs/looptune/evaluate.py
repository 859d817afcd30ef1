"""LoopTune evaluation (paper §VI-B/D, Fig. 8/9): tuners vs. the untuned nest and NumPy.

For each problem: GFLOPS of the untuned nest, of NumPy (single-threaded OpenBLAS) and of
each *tuner* with its tuning seconds. A tuner is any ``problem -> (GFLOPS, seconds)``
(or a :class:`Tuned`, which adds details for the JSON); a tuner that does not cover a
problem returns ``(nan, nan)``. Built-in tuners: the search baselines
(:func:`search_tuners`), a trained policy's results file (:func:`policy_tuner`) and
MetaSchedule (:mod:`.metaschedule`).

Python::

    ref = BestOf(lambda: TVMMeasurer(disk_cache=False), count=3)
    tuners = search_tuners(["greedy1", "random"], lambda: TVMMeasurer(disk_cache=False), remeasure=ref)
    report = evaluate(test[:5], {**tuners, "policy": mine}, ref)
    write_report(report, "out/")          # results.csv, results.json, summary.txt, fig8.png, fig9.png
    print(format_summary(report))

CLI (``python -m timerl.envs.looptune.evaluate --help``)::

    python -m timerl.envs.looptune.evaluate --policy runs/ppo_looptune --out runs/eval

runs the policy, the untuned nest and NumPy on all 440 test problems, and the searches
(``--time-limit 60`` s each) on a fixed subset of 32 of them (``--search-problems``);
``--num-problems 5`` samples fewer problems. Besides Fig. 8/9 it plots Fig. 10, the
policy's best speedup so far after each action. A progress bar (tqdm, on stderr) shows the
problem and tuner at work and the time left (``--quiet``: none); the results are
``results.csv`` (one row per problem) and ``results.json`` in ``--out``.

Fairness and noise: every search gets a fresh measurer without the disk cache, so its
seconds count its own measurements. On a shared machine, interference only ever slows a
kernel down, and one measurement can read 3x low. So the CLI measures the untuned nest
and the final state of every search and of the policy the same way, with
:class:`BestOf` (the best of ``--remeasure 3`` independent measurements), and reports
those figures; the search's own figure stays in the JSON (``search_gflops``).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import logging
import math
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from timerl.envs.looptune import dataset as ds
from timerl.envs.looptune.ir import (
    ACTIONS,
    Loop,
    LoopState,
    Nest,
    Problem,
    apply_action,
    check,
    initial_state,
)
from timerl.envs.looptune.measure import Measurer, gflops_all
from timerl.envs.looptune.search import DEFAULT_MAX_STEPS, DEFAULT_TIME_LIMIT, SEARCHES
from timerl.errors import TimeRLError

__all__ = [
    "BestOf",
    "MethodSummary",
    "ProblemResult",
    "Report",
    "Tuned",
    "Tuner",
    "evaluate",
    "format_summary",
    "main",
    "policy_rollout_tuner",
    "policy_tuner",
    "search_tuners",
    "state_from_key",
    "summarize",
    "write_report",
]

log = logging.getLogger(__name__)

UNTUNED, NUMPY = "untuned", "numpy"
WITHIN = 0.9  # "within 90 % of the best method" (paper §VI-D)


@dataclass(frozen=True)
class Tuned:
    """What a tuner may return instead of ``(gflops, seconds)``; ``info`` goes to the JSON."""

    gflops: float
    seconds: float
    info: Mapping[str, Any] = field(default_factory=dict)


Tuner = Callable[[Problem], "tuple[float, float] | Tuned"]


@dataclass(frozen=True)
class ProblemResult:
    """One problem's row: reference GFLOPS and, per tuner, GFLOPS / seconds (nan: not run)."""

    problem: Problem
    untuned: float
    numpy: float
    gflops: Mapping[str, float]
    seconds: Mapping[str, float]
    info: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def value(self, method: str) -> float:
        """GFLOPS of ``method``, the tuners' names plus ``"untuned"`` and ``"numpy"``."""
        if method == UNTUNED:
            return self.untuned
        if method == NUMPY:
            return self.numpy
        return self.gflops.get(method, math.nan)


@dataclass(frozen=True)
class Report:
    """All rows, the tuners' names in order, and how they were obtained (``meta``)."""

    methods: tuple[str, ...]
    results: tuple[ProblemResult, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MethodSummary:
    """One line of the summary table (geomeans skip problems where either side is not > 0)."""

    method: str
    num_problems: int  # problems with a result (failures included)
    speedup_geomean: float  # over the untuned nest
    numpy_fraction_geomean: float  # GFLOPS / NumPy's
    within_best_share: float  # share of its problems at >= 90 % of the best method there
    mean_seconds: float  # tuning time (nan for the references)
    failures: int  # results of 0 GFLOPS (a failed build or run)
    peak_fraction_geomean: float = math.nan  # GFLOPS / the machine's peak (meta["peak_gflops"])


def _peak(report: Report) -> float:
    """The machine's measured peak GFLOPS recorded in ``report.meta`` (nan when absent)."""
    return float(report.meta.get("peak_gflops") or math.nan)


def _x_peak(r: ProblemResult, methods: Sequence[str], peak: float) -> dict[str, float]:
    """Each method's GFLOPS on result ``r`` as a fraction of ``peak`` (the untuned nest and
    NumPy included)."""
    return {m: r.value(m) / peak for m in (UNTUNED, *methods, NUMPY)}


def _ok(x: float) -> bool:
    return math.isfinite(x) and x > 0


def geomean(values: Sequence[float]) -> float:
    """Geometric mean of the positive finite ``values`` (nan if there are none)."""
    logs = [math.log(v) for v in values if _ok(v)]
    return math.exp(sum(logs) / len(logs)) if logs else math.nan


def summarize(report: Report) -> tuple[MethodSummary, ...]:
    """Per method (``untuned``, the tuners, ``numpy``): see :class:`MethodSummary`. The best
    method of a problem is the highest GFLOPS among all of them, NumPy included."""
    methods = (UNTUNED, *report.methods, NUMPY)
    best = {
        r.problem: max((v for m in methods if math.isfinite(v := r.value(m))), default=math.nan)
        for r in report.results
    }
    peak = _peak(report)
    out = []
    for m in methods:
        rows = [r for r in report.results if math.isfinite(r.value(m))]
        secs = [r.seconds.get(m, math.nan) for r in rows]
        secs = [s for s in secs if math.isfinite(s)]
        out.append(
            MethodSummary(
                method=m,
                num_problems=len(rows),
                speedup_geomean=geomean([r.value(m) / r.untuned for r in rows if _ok(r.untuned)]),
                numpy_fraction_geomean=geomean([r.value(m) / r.numpy for r in rows if _ok(r.numpy)]),
                within_best_share=(
                    sum(r.value(m) >= WITHIN * best[r.problem] for r in rows) / len(rows)
                    if rows
                    else math.nan
                ),
                mean_seconds=sum(secs) / len(secs) if secs else math.nan,
                failures=sum(r.value(m) <= 0 for r in rows),
                peak_fraction_geomean=geomean([r.value(m) / peak for r in rows]) if _ok(peak) else math.nan,
            )
        )
    return tuple(out)


def format_summary(report: Report) -> str:
    """The summary as a fixed-width text table (``x peak`` only when ``meta`` has the peak)."""

    def num(x: float, fmt: str) -> str:
        return format(x, fmt) if math.isfinite(x) else "-"

    peak = report.meta.get("peak_gflops")
    lines = [
        f"{'method':<14}{'n':>4}{'speedup':>10}{'x numpy':>10}{'x peak' if peak else '':>{8 if peak else 0}}"
        f"{'>=90% best':>12}{'tune s':>10}{'fail':>6}",
    ]
    for s in summarize(report):
        lines.append(
            f"{s.method:<14}{s.num_problems:>4}{num(s.speedup_geomean, '.2f'):>10}"
            f"{num(s.numpy_fraction_geomean, '.2f'):>10}"
            + (f"{num(s.peak_fraction_geomean, '.2f'):>8}" if peak else "")
            + f"{num(100 * s.within_best_share, '.0f') + '%':>12}"
            f"{num(s.mean_seconds, '.1f'):>10}{s.failures:>6}"
        )
    lines.append(
        "speedup, x numpy"
        + (f", x peak (this machine's measured {peak:.1f} GFLOPS)" if peak else "")
        + ": geometric means over problems; tune s: mean tuning seconds"
    )
    return "\n".join(lines)


def evaluate(
    problems: Sequence[Problem],
    tuners: Mapping[str, Tuner],
    measurer: Measurer,
    *,
    numpy_fn: Callable[[Problem], float] | None = None,
    meta: Mapping[str, Any] | None = None,
    progress: bool = False,
) -> Report:
    """Run every tuner on every problem (one after the other: one measuring process).

    ``measurer`` measures the untuned nest; ``numpy_fn`` gives NumPy's GFLOPS (default
    :func:`.measure.numpy_gflops`, single-threaded in a child process). A tuner that
    raises is logged and recorded as nan. ``progress=True`` shows a progress bar with
    the time left (tqdm, on stderr).
    """
    if numpy_fn is None:
        from timerl.envs.looptune.measure import numpy_gflops as numpy_fn
    if UNTUNED in tuners or NUMPY in tuners:
        raise TimeRLError(
            f"tuner names {UNTUNED!r} and {NUMPY!r} are reserved for the references: rename the tuner"
        )
    results = []
    bar = _progress_bar(len(problems), "measuring") if progress else None
    # log lines go above the bar, not into it
    with _logging_above(bar):
        for i, p in enumerate(problems):
            if bar is not None:
                bar.set_postfix_str(p.name, refresh=False)
            untuned = measurer.gflops(initial_state(p))
            npy = numpy_fn(p)
            log.info(
                "[%d/%d] %s: untuned %.2f GFLOPS, numpy %.2f", i + 1, len(problems), p.name, untuned, npy
            )
            gflops, seconds, info = {}, {}, {}
            for name, tuner in tuners.items():
                if bar is not None:
                    bar.set_postfix_str(f"{p.name} {name}", refresh=False)
                try:
                    out = tuner(p)
                except Exception:
                    log.exception("tuner %s failed on %s; recorded as nan", name, p.name)
                    out = (math.nan, math.nan)
                tuned = out if isinstance(out, Tuned) else Tuned(float(out[0]), float(out[1]))
                gflops[name], seconds[name] = tuned.gflops, tuned.seconds
                if tuned.info:
                    info[name] = dict(tuned.info)
                if math.isfinite(tuned.gflops):
                    log.info("  %-10s %7.2f GFLOPS in %6.1f s", name, tuned.gflops, tuned.seconds)
            results.append(ProblemResult(p, untuned, npy, gflops, seconds, info))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return Report(tuple(tuners), tuple(results), dict(meta or {}))


def _logging_above(bar: Any) -> contextlib.AbstractContextManager[Any]:
    """While ``bar`` shows, the root logger's console lines are written above it (tqdm)."""
    if bar is None:
        return contextlib.nullcontext()
    from tqdm.contrib.logging import logging_redirect_tqdm

    return logging_redirect_tqdm()


def _progress_bar(total: int, desc: str) -> Any:
    """A tqdm bar (``timerl[looptune]`` installs tqdm)."""
    try:
        from tqdm import tqdm
    except ImportError as exc:
        raise TimeRLError("progress bars need tqdm: pip install 'timerl[looptune]'") from exc
    return tqdm(total=total, desc=desc, unit="problem", dynamic_ncols=True)


class BestOf:
    """A measurer that measures each schedule with ``count`` fresh measurers and keeps
    the best (on a shared machine, interference only slows kernels down), cached by
    :attr:`LoopState.schedule_key`."""

    def __init__(self, make_measurer: Callable[[], Measurer], count: int = 3) -> None:
        if count < 1:
            raise TimeRLError(f"BestOf needs count >= 1, got {count}")
        self.name = f"best_of_{count}"
        self._make, self._count = make_measurer, count
        self._mem: dict[str, float] = {}

    def gflops(self, state: LoopState) -> float:
        key = state.schedule_key
        if key not in self._mem:
            self._mem[key] = max(self._make().gflops(state) for _ in range(self._count))
        return self._mem[key]


def search_tuners(
    names: Sequence[str],
    make_measurer: Callable[[], Measurer],
    *,
    time_limit: float = DEFAULT_TIME_LIMIT,
    max_steps: int = DEFAULT_MAX_STEPS,
    max_measurements: int | None = None,
    seed: int = 0,
    remeasure: Measurer | None = None,
) -> dict[str, Tuner]:
    """Tuners running the named searches (:data:`.search.SEARCHES`) from the untuned nest.

    ``make_measurer`` gives each search run a measurer of its own (so one search's
    cache does not speed up another); ``remeasure``, if given, measures the search's
    best state once more (e.g. a :class:`BestOf`), and that is the GFLOPS reported.
    """
    unknown = [n for n in names if n not in SEARCHES]
    if unknown:
        raise TimeRLError(f"unknown searches {unknown}; valid: {', '.join(SEARCHES)}")

    def make(name: str) -> Tuner:
        def run(problem: Problem) -> Tuned:
            result = SEARCHES[name](
                initial_state(problem),
                make_measurer(),
                time_limit=time_limit,
                max_steps=max_steps,
                max_measurements=max_measurements,
                seed=seed,
            )
            final = remeasure.gflops(result.state) if remeasure is not None else result.gflops
            info = {
                "state": result.state.key,
                "actions": list(result.actions),
                "search_gflops": result.gflops,
                "num_measured": result.num_measured,
                "complete": result.complete,
            }
            return Tuned(final, result.seconds, info)

        return run

    return {name: make(name) for name in names}


def state_from_key(key: str) -> LoopState:
    """Parse :attr:`LoopState.key` (``mm_64x80x96|c:m64,k96,n80|w:m64,n80|@0``) back to a state."""
    try:
        name, compute, write, cursor = key.split("|")
        problem = Problem.from_name(name)
        loops = []
        for section, nest in ((compute, Nest.COMPUTE), (write, Nest.WRITE)):
            tag, body = section.split(":", 1)
            if tag != nest.value:
                raise ValueError(section)
            for text in body.split(","):
                size, _, tail = text[1:].partition("r")
                loops.append(Loop(text[0], int(size), int(tail or 0), nest))
        state = LoopState(problem, tuple(loops), int(cursor.removeprefix("@")))
        check(state)
    except (ValueError, TimeRLError) as exc:
        raise TimeRLError(
            f"cannot parse LoopTune state key {key!r} ({exc}); expected e.g. {_KEY_EXAMPLE}"
        ) from exc
    if state.key != key:
        raise TimeRLError(f"state key {key!r} is not canonical (re-prints as {state.key!r})")
    return state


_KEY_EXAMPLE = "'mm_64x80x96|c:m64,k96,n80|w:m64,n80|@0'"
_POLICY_FORMAT = (
    '{"mm_64x80x96": {"seconds": 0.4, "actions": ["down", "split_16"]}, '
    '"mm_80x64x64": {"seconds": 0.3, "state": "mm_80x64x64|c:...|@2"}, '
    '"mm_96x96x96": {"seconds": 0.5, "gflops": 51.2}}'
)


def policy_tuner(results: str | os.PathLike[str] | Mapping[str, Any], measurer: Measurer | None) -> Tuner:
    """A tuner reading a trained policy's results: a JSON file (or mapping) from problem
    name to ``{"seconds": s}`` plus one of ``"actions"`` (action names or indices,
    replayed from the untuned nest), ``"state"`` (a final state key) or ``"gflops"``.
    Actions and states are measured with ``measurer``; a plain ``gflops`` is taken as is
    (only comparable if it was measured the same way). Problems not listed give nan."""
    if isinstance(results, Mapping):
        table = dict(results)
    else:
        try:
            table = json.loads(Path(results).read_text())
        except (OSError, ValueError) as exc:
            raise TimeRLError(
                f"cannot read policy results {results}: {exc}; expected JSON like {_POLICY_FORMAT}"
            ) from exc
    if not isinstance(table, dict) or not all(isinstance(v, dict) and "seconds" in v for v in table.values()):
        raise TimeRLError(
            f"policy results must map problem names to entries with 'seconds', like {_POLICY_FORMAT}"
        )

    def run(problem: Problem) -> Tuned:
        entry = table.get(problem.name)
        if entry is None:
            return Tuned(math.nan, math.nan)
        seconds = float(entry["seconds"])
        if "actions" in entry or "state" in entry:
            if measurer is None:
                raise TimeRLError("policy results with 'actions' or 'state' need a measurer: pass one")
            if "state" in entry:
                state = state_from_key(str(entry["state"]))
            else:
                state = initial_state(problem)
                for a in entry["actions"]:
                    state = apply_action(state, a if isinstance(a, int) else ACTIONS.index(a))
            if state.problem != problem:
                raise TimeRLError(f"policy result for {problem.name} is a state of {state.problem.name}")
            return Tuned(measurer.gflops(state), seconds, {"state": state.key})
        if "gflops" in entry:
            return Tuned(float(entry["gflops"]), seconds)
        raise TimeRLError(f"policy result for {problem.name} has none of actions/state/gflops: {entry}")

    return run


def policy_rollout_tuner(
    policy: Any, measurer: Measurer, remeasure: Measurer | None = None, steps: int = 10
) -> Tuner:
    """A tuner playing a trained :class:`timerl.looptune.Policy` greedily for ``steps``
    actions from the untuned nest; every state is measured with ``measurer`` and the best
    one is kept, then measured again by ``remeasure`` (e.g. a :class:`BestOf` of fresh
    measurers) if given. The info holds the actions and ``step_gflops``: the best GFLOPS
    so far after each action, as ``measurer`` saw them (Fig. 10)."""

    def run(problem: Problem) -> Tuned:
        t0 = time.perf_counter()
        states, actions = policy.rollout(initial_state(problem), steps)
        values = gflops_all(measurer, states)  # each new schedule built once, all in one module
        seconds = time.perf_counter() - t0
        best = max(range(len(states)), key=lambda k: values[k])
        running = [max(values[: k + 1]) for k in range(len(values))]
        final = remeasure.gflops(states[best]) if remeasure is not None else values[best]
        info = {"state": states[best].key, "actions": [ACTIONS[a] for a in actions], "step_gflops": running}
        return Tuned(final, seconds, info)

    return run


def write_report(report: Report, out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``results.csv``, ``results.json``, ``summary.txt`` and the plots
    ``fig8.png`` (GFLOPS and tuning time per problem) and ``fig9.png`` (speedup
    distribution per method) into ``out_dir``; return their paths by name."""
    from timerl.envs.looptune import evaluate_plots

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        name: out / name for name in ("results.csv", "results.json", "summary.txt", "fig8.png", "fig9.png")
    }
    peak = _peak(report)
    header = ["problem", "kernel", "sizes", "untuned_gflops", "numpy_gflops"]
    for m in report.methods:
        header += [f"{m}_gflops", f"{m}_seconds"]
    header += [f"{m}_x_peak" for m in (UNTUNED, *report.methods, NUMPY)]
    with paths["results.csv"].open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for r in report.results:
            sizes = ",".join(f"{d}={n}" for d, n in r.problem.extents.items())
            row: list[Any] = [r.problem.name, r.problem.kernel.name, sizes, r.untuned, r.numpy]
            for m in report.methods:
                row += [r.gflops.get(m, math.nan), r.seconds.get(m, math.nan)]
            row += list(_x_peak(r, report.methods, peak).values())
            w.writerow(row)
    doc = {
        "meta": dict(report.meta),
        "methods": list(report.methods),
        "problems": [
            {
                "problem": r.problem.name,
                "kernel": r.problem.kernel.name,
                "sizes": r.problem.extents,
                "untuned_gflops": r.untuned,
                "numpy_gflops": r.numpy,
                "gflops": dict(r.gflops),
                "seconds": dict(r.seconds),
                "x_peak": _x_peak(r, report.methods, peak),
                "info": {k: dict(v) for k, v in r.info.items()},
            }
            for r in report.results
        ],
        "summary": [vars(s) for s in summarize(report)],
    }
    paths["results.json"].write_text(json.dumps(_jsonable(doc), indent=1))
    paths["summary.txt"].write_text(format_summary(report) + "\n")
    evaluate_plots.plot_gflops_and_time(report, paths["fig8.png"])
    evaluate_plots.plot_speedups(report, paths["fig9.png"])
    if any("step_gflops" in info for r in report.results for info in r.info.values()):
        paths["fig10.png"] = out / "fig10.png"
        evaluate_plots.plot_steps(report, paths["fig10.png"])
    return paths


def _jsonable(x: Any) -> Any:
    """nan/inf become null (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    return x


# --- CLI ---------------------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m timerl.envs.looptune.evaluate",
        description="LoopTune evaluation: search baselines, a trained policy, MetaSchedule and NumPy "
        "on test problems (paper Fig. 8/9).",
    )
    p.add_argument("--dataset", default="mm", help="benchmark set (default mm)")
    p.add_argument("--split-seed", type=int, default=0, help="seed of the train/test split (default 0)")
    p.add_argument(
        "--num-problems", type=int, default=0, help="random test problems to use (default 0: all 440 of mm)"
    )
    p.add_argument(
        "--search-problems",
        type=int,
        default=32,
        help="run the searches on a fixed subset of this many of the problems (default 32; 0: all)",
    )
    p.add_argument("--problems", default="", help="comma-separated problem names (mm_64x80x96) instead")
    p.add_argument("--seed", type=int, default=0, help="seed of the problem sample and random search")
    p.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT, help="seconds per search (60)")
    p.add_argument("--max-steps", type=int, default=DEFAULT_MAX_STEPS, help="actions per sequence (10)")
    p.add_argument("--searches", default=",".join(SEARCHES), help=f"comma-separated, of {','.join(SEARCHES)}")
    p.add_argument("--measurer", choices=("tvm", "analytic"), default="tvm", help="analytic: tests only")
    p.add_argument(
        "--remeasure",
        type=int,
        default=3,
        help="measure untuned and final states as the best of N fresh measurements (default 3; "
        "0: untuned once, searches report their own best)",
    )
    p.add_argument(
        "--policy-results", default="", help="JSON of a trained policy's results (see policy_tuner)"
    )
    p.add_argument(
        "--policy",
        default="",
        help="a trained policy (checkpoint file or folder, or a run folder such as runs/ppo_looptune): "
        "played greedily on every problem",
    )
    p.add_argument(
        "--metaschedule-sizes", default="", help="e.g. 64,128: also tune n x n x n with MetaSchedule"
    )
    p.add_argument("--metaschedule-trials", type=int, default=64, help="MetaSchedule trials per size (64)")
    p.add_argument(
        "--out",
        default="runs/looptune_eval",
        help="output folder (default runs/looptune_eval, beside the examples' runs): results.csv, "
        "results.json, summary.txt and the figures; a training run's folder keeps its metrics.csv "
        "and checkpoints",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar (the log lines stay)")
    return p.parse_args(argv)


def _pick_problems(args: argparse.Namespace) -> list[Problem]:
    if args.problems:
        by_name = {p.name: p for p in ds.problems(args.dataset)}
        missing = [n for n in args.problems.split(",") if n not in by_name]
        if missing:
            raise TimeRLError(
                f"unknown problems {missing} in dataset {args.dataset}: names look like mm_64x80x96 "
                "(mm sizes 64..256 step 16; see timerl.envs.looptune.dataset)"
            )
        return [by_name[n] for n in args.problems.split(",")]
    _, test = ds.split(args.dataset, seed=args.split_seed)
    if not 0 <= args.num_problems <= len(test):
        raise TimeRLError(f"--num-problems must be in 0..{len(test)} (0: all), got {args.num_problems}")
    if args.num_problems == 0:
        return list(test)
    chosen = set(random.Random(args.seed).sample(range(len(test)), args.num_problems))
    return [p for i, p in enumerate(test) if i in chosen]


def _fixed_subset(problems: Sequence[Problem], n: int) -> list[Problem]:
    """``n`` of ``problems`` (all if ``n`` is 0 or more than there are), the same every run:
    every ``len / n``-th one, in order."""
    if n <= 0 or n >= len(problems):
        return list(problems)
    return [problems[(k * len(problems)) // n] for k in range(n)]


def _only_on(problems: set[Problem], tuner: Tuner) -> Tuner:
    """``tuner`` on ``problems``, ``(nan, nan)`` (not run) elsewhere."""
    return lambda p: tuner(p) if p in problems else (math.nan, math.nan)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (see the module doc); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if os.environ.get("TVM_NUM_THREADS", "1") != "1":
        log.warning(
            "TVM_NUM_THREADS=%s: timings are meant single-threaded; unset it", os.environ["TVM_NUM_THREADS"]
        )
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    from timerl.envs.looptune.measure import AnalyticCostModel, TVMMeasurer

    problems = _pick_problems(args)
    sizes = [int(s) for s in args.metaschedule_sizes.split(",") if s]
    ms_problems = [Problem(n, n, n) for n in sizes]
    problems += [p for p in ms_problems if p not in problems]
    if args.measurer == "analytic":
        log.warning("--measurer analytic: GFLOPS are model estimates for tests, not measurements")
        shared = AnalyticCostModel()
        fresh: Callable[[], Measurer] = lambda: shared  # noqa: E731  deterministic: sharing is harmless
        measurer: Measurer = shared
    else:
        measurer = TVMMeasurer()
        fresh = lambda: TVMMeasurer(disk_cache=False)  # noqa: E731
    reference = BestOf(fresh, args.remeasure) if args.remeasure > 0 else None
    names = [s for s in args.searches.split(",") if s]
    searched = set(_fixed_subset(problems, args.search_problems))
    tuners: dict[str, Tuner] = {
        name: _only_on(searched, tuner)
        for name, tuner in search_tuners(
            names,
            fresh,
            time_limit=args.time_limit,
            max_steps=args.max_steps,
            seed=args.seed,
            remeasure=reference,
        ).items()
    }
    if args.policy_results:
        tuners["policy"] = policy_tuner(args.policy_results, reference or fresh())
    if args.policy:
        from timerl.looptune.policy import Policy

        tuners["policy"] = policy_rollout_tuner(Policy.load(args.policy), fresh(), reference, args.max_steps)
    if ms_problems:
        from timerl.envs.looptune.metaschedule import metaschedule_tuner

        ms_tune = metaschedule_tuner(trials=args.metaschedule_trials, seed=args.seed)
        tuners["metaschedule"] = lambda p: ms_tune(p) if p in ms_problems else (math.nan, math.nan)
    from timerl.envs.looptune.measure import numpy_gflops_batch

    log.info("timing NumPy on %d problems (one child process)", len(problems))
    npy = dict(zip(problems, numpy_gflops_batch(problems), strict=True))
    meta = {
        "search_problems": sorted(p.name for p in searched) if names else [],
        "command": " ".join([os.path.basename(sys.executable), "-m", "timerl.envs.looptune.evaluate", *argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "dataset": args.dataset,
        "measurer": args.measurer,
        "time_limit": args.time_limit,
        "max_steps": args.max_steps,
        "remeasure": args.remeasure,
        "metaschedule_trials": args.metaschedule_trials if ms_problems else None,
    }
    if args.measurer == "tvm":
        from timerl.envs.looptune import tvm_lower
        from timerl.envs.looptune.measure import machine_peak

        meta["cpu"] = tvm_lower.host_cpu()
        meta["peak_gflops"] = machine_peak()
    report = evaluate(
        problems, tuners, reference or measurer, numpy_fn=npy.__getitem__, meta=meta, progress=not args.quiet
    )
    paths = write_report(report, args.out)
    print(format_summary(report))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

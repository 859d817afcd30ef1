"""Differential fuzzing: random well-defined programs, compiled by timerl with compile
options on and off on both backends, against the independent interpreter of
``fuzz_programs.py``.

Three profiles:

* quick (default test run): one program focused on each feature, a few option sets;
* fresh (default test run, so in CI): programs of seeds that change every run, drawn at
  random and printed (``TIMERL_FUZZ_SEED=<n>`` repeats a run from seed ``n``), each with the
  default options on both backends and one more option set, until ``TIMERL_FUZZ_BUDGET``
  seconds (default 45) or ``TIMERL_FUZZ_FRESH`` programs (default 40) are spent; a failing
  program is written to ``TIMERL_FUZZ_ARTIFACTS`` (default ``fuzz-failures/``) with its seed,
  options, error and the command that repeats it;
* long (``pytest -m fuzz``, nightly-sized): ``TIMERL_FUZZ_PROGRAMS`` programs (default 150)
  from seed ``TIMERL_FUZZ_START`` (default 1000), every single option flipped (about 15 s a
  program on 2 cores), and each compiled with a ``memory_budget`` below its default peak
  (:func:`check_budget`: refused before running, or run within it with equal values).

A failure found by the fresh or long profile becomes a regression: its seed goes into
:data:`REGRESSION_SEEDS`.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fuzz_programs import FEATURES, Program, _udf_reads_self, features, generate, reference, render

from timerl.compile import CompileOptions
from timerl.errors import MemoryBudgetError

W0 = np.array([0.3, -0.2], np.float32)
SWITCHES = [f.name for f in fields(CompileOptions) if f.type in ("bool", bool)]
RTOL, ATOL = 2e-4, 2e-5
MARGIN = 1e-4  # a comparison closer than this to its threshold may go either way


@pytest.fixture(autouse=True)
def _trace_every_body(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled iteration bodies (``compile_iterations``) traced the first time each key is
    seen, so that the few iterations of a random program run through them; every call fed
    from the last call's results is checked against the store rebuilt."""
    from timerl.runtime import iteration

    monkeypatch.setattr(iteration, "TRACE_AFTER", 1)
    monkeypatch.setattr(iteration, "CHECK_FED", True)  # calls fed from the last call: checked


class IllConditioned(Exception):
    """A comparison of the program sits within float rounding of its threshold, or a value
    overflows (inf, or nan from inf - inf: its float32 rounding is not comparable)."""


def _option_sets(long: bool) -> list[dict[str, Any]]:
    # defaults, all off, frees and donation flipped from their default (the quick profile
    # checks both settings of each), incrementalization and swapping on
    default = CompileOptions()
    sets = [
        {},
        dict.fromkeys(SWITCHES, False),
        {"dealloc": not default.dealloc},
        {"donate": not default.donate, "dealloc": True},
        # incrementalization with a tiny threshold: every reduction over more than 2 floats
        # runs in blocks (the generator's tensors are a few floats)
        {"incrementalize": 8},
        # swapping of every eligible tensor (a tiny threshold, so that it fires)
        {"swap": True, "swap_threshold": 1},
        # the iteration loop's body as one compiled call (JAX; traced at every key here)
        {"compile_iterations": True},
    ]
    if long:
        # each switch that is on by default, off (explain_memory, accumulate: off already)
        sets += [{name: False} for name in SWITCHES if getattr(default, name) and {name: False} not in sets]
        # both memory passes together (memory_budget's last resort: blocks fetched per block)
        sets.append({"incrementalize": 8, "swap": True, "swap_threshold": 1})
        # running sums over episodes (memory_budget's first try under a dynamic T)
        sets.append({"accumulate": True})
    return sets


def expected(prog: Program) -> dict[str, dict]:
    """The interpreter's values for ``prog``; :class:`IllConditioned` if a comparison sits
    on its threshold."""
    margins: list[float] = []
    want = reference(prog, W0, margins)
    if margins and min(margins) < MARGIN:
        raise IllConditioned(f"a comparison within {min(margins):.1e} of its threshold")
    for name, points in want.items():
        for pt, v in points.items():
            if not np.all(np.isfinite(np.asarray(v, np.float64))):
                raise IllConditioned(f"{name} at {pt} is not finite ({np.asarray(v).tolist()})")
    return want


def check_program(
    prog: Program, backend: str, options: dict[str, Any], want: dict[str, dict] | None = None
) -> int:
    """Compile and run ``prog``; compare every sunk value with the reference. Returns the
    number of values checked."""
    want = expected(prog) if want is None else want
    store: dict[str, dict] = {name: {} for name in want}
    ctx, bounds = render(prog, W0, store)
    ctx.compile(bounds, backend=backend, **options).execute()
    n = 0
    for name, points in want.items():
        got = store[name]
        assert sorted(got) == sorted(points), f"{name}: sunk at {sorted(got)}, expected {sorted(points)}"
        for pt, v in points.items():
            g = np.asarray(got[pt], np.float64)  # int64 counters and bool flags compare as numbers
            assert g.shape == np.shape(v), f"{name} at {pt}: shape {g.shape}, expected {np.shape(v)}"
            np.testing.assert_allclose(g, v, rtol=RTOL, atol=ATOL, err_msg=f"{name} at {pt}")
            n += 1
    return n


BUDGET_FRACTION = 0.95
"""``memory_budget`` of :func:`check_budget`: this fraction of the default run's device peak."""


def check_budget(prog: Program, backend: str, fraction: float = BUDGET_FRACTION) -> str:
    """Compile ``prog`` with a ``memory_budget`` below its default run's device peak (issue
    33: a budget never exceeded at run time). Either :class:`MemoryBudgetError` before
    anything runs (``"refused"``), or a run whose device peak stays within the budget and
    whose sunk values equal the reference (``"ran"``). A ``MemoryBudgetError`` raised at run
    time (the store caught an estimate below the real peak) fails."""
    want = expected(prog)
    store: dict[str, dict] = {name: {} for name in want}
    ctx, bounds = render(prog, W0, store)
    base = ctx.compile(bounds, backend=backend)
    base.execute()
    budget = max(1, int(base.memory_stats().pool("device").peak_bytes * fraction))
    store = {name: {} for name in want}
    ctx, bounds = render(prog, W0, store)
    try:
        ex = ctx.compile(bounds, backend=backend, memory_budget=budget)
    except MemoryBudgetError:
        assert not any(store.values()), "values were sunk before MemoryBudgetError"
        return "refused"
    ex.execute()  # a MemoryBudgetError here: the compile-time check missed the real peak
    peak = ex.memory_stats().pool("device").peak_bytes
    assert peak <= budget, f"device peak {peak} B over memory_budget={budget} B"
    for name, points in want.items():
        got = store[name]
        assert sorted(got) == sorted(points), f"{name}: sunk at {sorted(got)}, expected {sorted(points)}"
        for pt, v in points.items():
            np.testing.assert_allclose(np.asarray(got[pt], np.float64), v, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{name} at {pt}")  # fmt: skip
    return "ran"


def _run(seeds: range, long: bool, progress: bool = False) -> dict[str, Any]:
    stats: dict[str, Any] = {"programs": 0, "compiles": 0, "checks": 0, "failures": [], "ill_conditioned": 0}
    t0 = time.perf_counter()
    for seed in seeds:
        prog = generate(seed)
        stats["programs"] += 1
        try:
            want = expected(prog)
        except IllConditioned:
            stats["ill_conditioned"] += 1
            continue
        for backend in ("torch", "jax"):
            for opts in _option_sets(long):
                try:
                    stats["checks"] += check_program(prog, backend, opts, want)
                except Exception as e:  # collect every failure with its program, then fail once
                    stats["failures"].append(f"seed {seed} {backend} {opts}: {type(e).__name__}: {str(e)[:400]}\n"
                                             f"{prog.describe()}")  # fmt: skip
                    if progress:
                        print(f"FAILURE {stats['failures'][-1]}", flush=True)
                stats["compiles"] += 1
        if long:  # a budget below the default peak, one backend a program in turn (issue 33)
            backend = ("torch", "jax")[seed % 2]
            try:
                outcome = f"budget {check_budget(prog, backend)}"
                stats[outcome] = stats.get(outcome, 0) + 1
            except Exception as e:
                stats["failures"].append(f"seed {seed} {backend} memory_budget: {type(e).__name__}: "
                                         f"{str(e)[:400]}\n{prog.describe()}")  # fmt: skip
        if progress:
            print(
                f"fuzz seed {seed}: {stats['compiles']} compiles, {stats['checks']} checks, "
                f"{len(stats['failures'])} failures, {stats['ill_conditioned']} ill-conditioned, "
                f"{time.perf_counter() - t0:.0f}s",
                flush=True,
            )
    stats["seconds"] = round(time.perf_counter() - t0, 1)
    return stats


QUICK_SEEDS = range(len(FEATURES))  # one program focused on each feature


def test_quick_profile_covers_every_feature() -> None:
    """Every feature the generator knows appears in the quick profile's programs (most in
    more than one: each seed is focused on one and draws the others at random)."""
    seen = [features(generate(seed)) for seed in QUICK_SEEDS]
    basics = {
        "fwd",
        "bwd",
        "read",
        "win",
        "where",
        "rwhere",
        "stack",
        "isym",
        "param0",
        "param1",
        "dynamic_t",
    }
    for f in (*FEATURES, *sorted(basics)):
        assert any(f in s for s in seen), f"feature {f} missing from the quick profile"


def test_no_host_call_reads_a_shifted_recurrence_itself() -> None:
    """A host call runs at every point of its own domain: in the step of a recurrence over a
    shifted ``i`` (``x[i + 1, t + 1] = udf(x[i + 1, t])``) it would read ``x[I, t]`` at
    ``i = I - 1``, undefined (the library refuses it: seed 517400018 was ill-formed)."""
    for seed in (517400018, *range(1_000_000, 1_000_300)):
        for x in generate(seed).tensors:
            assert not (x.shift and _udf_reads_self(x.step)), f"seed {seed}: {x.name}"


@pytest.mark.parametrize("seed", QUICK_SEEDS)
def test_fuzz_quick(seed: int) -> None:
    """A few programs (one test each), all options on and all off, both backends."""
    stats = _run(range(seed, seed + 1), long=False)
    assert not stats["failures"], "\n\n".join(stats["failures"])
    assert stats["ill_conditioned"] == 0  # every feature of the quick profile is checked


@pytest.mark.fuzz
def test_fuzz_long() -> None:
    n = int(os.environ.get("TIMERL_FUZZ_PROGRAMS", "150"))
    start = int(os.environ.get("TIMERL_FUZZ_START", "1000"))
    stats = _run(range(start, start + n), long=True, progress=True)
    print(
        f"\nfuzz: {stats['programs']} programs ({stats['ill_conditioned']} skipped as ill-conditioned), "
        f"{stats['compiles']} compiles, {stats['checks']} checks, {len(stats['failures'])} failures, {stats['seconds']}s; "
        f"memory_budget below the default peak: {stats.get('budget ran', 0)} ran, "
        f"{stats.get('budget refused', 0)} refused before running"
    )
    assert not stats["failures"], "\n\n".join(stats["failures"][:10])


FRESH_BUDGET_S = 45.0
FRESH_PROGRAMS = 40


def _fresh_seed() -> int:
    """The first seed of a fresh run: ``TIMERL_FUZZ_SEED``, else a random one (above the
    long profile's default range)."""
    env = os.environ.get("TIMERL_FUZZ_SEED", "")
    return int(env) if env else random.SystemRandom().randrange(10**6, 10**9)


def _save_failure(seed: int, backend: str, opts: dict[str, Any], exc: BaseException, prog: Program) -> Path:
    """Write a failing program of the fresh profile where CI keeps it (``TIMERL_FUZZ_ARTIFACTS``)."""
    out = Path(os.environ.get("TIMERL_FUZZ_ARTIFACTS", "fuzz-failures"))
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"seed{seed}_{backend}.txt"
    path.write_text(
        f"seed {seed}, backend {backend}, options {opts}\n"
        f"repeat: TIMERL_FUZZ_SEED={seed} TIMERL_FUZZ_FRESH=1 python -m pytest -q tests/fuzz -k fresh\n"
        f"  (or check_program(generate({seed}), {backend!r}, {opts}) in tests/fuzz/test_fuzz.py)\n\n"
        f"{type(exc).__name__}: {exc}\n\nprogram:\n{prog.describe()}\n"
    )
    return path


def test_fuzz_fresh(capsys: pytest.CaptureFixture[str]) -> None:
    """Programs never run before, within a time budget (module doc): defaults on both
    backends, and one more option set per program (the long profile's, in turn)."""
    first = _fresh_seed()
    budget = float(os.environ.get("TIMERL_FUZZ_BUDGET", FRESH_BUDGET_S))
    most = int(os.environ.get("TIMERL_FUZZ_FRESH", FRESH_PROGRAMS))
    with capsys.disabled():
        print(f"\nfuzz fresh: from seed {first} (TIMERL_FUZZ_SEED={first} repeats this run)", flush=True)
    extra = _option_sets(long=True)[1:]
    stats = {"programs": 0, "ill_conditioned": 0, "checks": 0}
    failures: list[str] = []
    t0 = time.perf_counter()
    seed = first
    while stats["programs"] < most and time.perf_counter() - t0 < budget:
        prog = generate(seed)
        stats["programs"] += 1
        try:
            want = expected(prog)
        except IllConditioned:
            stats["ill_conditioned"] += 1
            seed += 1
            continue
        runs = [
            ("torch", {}),
            ("jax", {}),
            (("torch", "jax")[seed // len(extra) % 2], extra[seed % len(extra)]),
        ]
        for backend, opts in runs:
            try:
                stats["checks"] += check_program(prog, backend, opts, want)
            except Exception as e:  # every failure with its program, then fail once
                path = _save_failure(seed, backend, opts, e, prog)
                failures.append(
                    f"seed {seed} {backend} {opts}: {type(e).__name__}: {str(e)[:400]} (saved to {path})"
                )
        seed += 1
    with capsys.disabled():
        print(
            f"fuzz fresh: seeds {first}..{seed - 1}: {stats['programs']} programs "
            f"({stats['ill_conditioned']} ill-conditioned), {stats['checks']} checks, {len(failures)} failures, "
            f"{time.perf_counter() - t0:.0f}s",
            flush=True,
        )
    assert stats["checks"] > 0
    assert not failures, "\n\n".join(failures)


def test_fuzz_fresh_saves_a_failing_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure of the fresh profile leaves a file that names the seed, options and error
    and holds the program."""
    monkeypatch.setenv("TIMERL_FUZZ_ARTIFACTS", str(tmp_path / "art"))
    prog = generate(7)
    path = _save_failure(7, "jax", {"cse": False}, ValueError("boom"), prog)
    text = path.read_text()
    assert path.parent == tmp_path / "art"
    assert "seed 7, backend jax, options {'cse': False}" in text and "TIMERL_FUZZ_SEED=7" in text
    assert "ValueError: boom" in text and prog.describe() in text


REGRESSION_SEEDS = (9058, 1000008, 1000018, 1000088, 941930050, 517300100, 520000026)
"""Programs of long runs that failed before their fix, checked with the defaults on every run.

9058: statements over ``(i, t)`` under a per-``i`` dynamic ``T`` that read nothing along
``i``; isl put the ``t`` loop outside the ``i`` loop, so one ``T`` bounded every episode
(``scheduler.episode_order_edges``).
1000008: a forward recurrence over a shifted ``i`` (``x[i + 1, t + 1] = f(x[i + 1, t])``):
``vectorize_partial`` took its cycle (reads at ``i + 1`` and ``i - 1``) for one carried
along ``i`` and vectorized its body over ``t``; ScheduleError (issue 38).
1000018: a table of 4 rows read at ``t < T = 3``: ``vectorize_partial`` made its 4 rows the
batch axis of ``t``; BackendError in a WHERE (issue 38).
1000088: the sum and the mean of one vector: ``remove_broadcasts`` re-pointed both inputs of
its gradient's ``ADD`` at (1,) operands (issue 38; here the values stayed right, the PDG
did not: ``verify_pdg`` rejects it).
941930050: ``stack`` of an int64 and a float32 value took the int64 dtype: autodiff dropped
the parameter's gradient through it (issue 38), and a window of varying length made a scan
fail at run time (now planned as unscanned).
517300100: the gradient of ``x1[min(i + 1, I - 1), max(t - 1, 0)]`` (``x1`` a recurrence)
reads all of its incoming gradient, ``g[0:I, 0:T]``; ``vectorize_partial`` vectorized ``g``
over ``t`` and made that slice the first stacked dim: an ``IDENTITY`` of shape (I, T, 2)
received (T, I, 2) (``PDGError``, every option set; issue 38).
520000026: ``discounted_sum`` of an int64 window (``t // 2`` over ``t:min(t + 2, T)``) cast its
weights ``gamma**k`` to int64 (1, 0, ...): now integers are summed as float32."""


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_fuzz_regressions(seed: int, backend: str) -> None:
    prog = generate(seed)
    assert check_program(prog, backend, {}) > 0


def test_fuzz_incrementalized_mask_of_a_floor_div_read() -> None:
    """Seed 29 with ``incrementalize=8``: the gradient of ``x0[t // 2]`` masks the sink points
    with ``EQ(comp(q)[0:T], s)``, vectorized over ``t``; incrementalize took its read of all
    ``T`` rows of ``comp`` (``batch[t=0:T]``) for the sink's own batch dim, tiled the EQ into
    blocks of one row and kept reading all ``T`` rows: ``w.grad`` came out wrong (1.31 for
    1.26), then ``verify_pdg`` refused the PDG (issue 38). The read is now a stacked axis cut
    to the block's rows."""
    assert check_program(generate(29), "torch", {"incrementalize": 8}) > 0


LONG = pytest.mark.fuzz
BUDGET_CASES = (
    (4, "torch", "refused"),
    (8, "torch", "ran"),
    (25, "jax", "ran"),
    (32, "torch", "ran"),
    (55, "jax", "ran"),
    pytest.param(12, "torch", "ran", marks=LONG),
    pytest.param(34, "torch", "ran", marks=LONG),
    pytest.param(44, "jax", "ran", marks=LONG),
    pytest.param(1000026, "torch", "ran", marks=LONG),
)
"""Programs compiled with ``memory_budget`` at 95% of their default device peak
(:func:`check_budget`), with today's outcome: each way the budget fits a program is taken
by one of them: running sums over a dynamic ``T`` (8: with ``vectorize_dynamic`` off; 44,
1000026), incrementalization (25, 34), swapping (55), both (12), incrementalization found
by the last resort (32: ``_fit_swapping`` had nothing to swap and raised ``ValueError``),
and a refusal before running (4). The last four run with the long profile (``-m fuzz``).
Of 90 programs surveyed (seeds 0-59 and 1000000-1000029, budgets at 90-95%), 13 ran within
the budget with the reference values and 77 were refused; none raised at run time. The estimate with frees is above the peak of runs that free more
(``free_iterations``, donation), or the peak grows with a dynamic ``T`` (backward
recurrences, ``t:T`` windows)."""


@pytest.mark.parametrize(("seed", "backend", "outcome"), BUDGET_CASES)
def test_fuzz_budget(seed: int, backend: str, outcome: str) -> None:
    """A budget below the default peak is never exceeded at run time (issue 33): refused
    before running, or a run within it with the values of the reference."""
    assert check_budget(generate(seed), backend) == outcome


INCREMENTALIZE_SEEDS = (
    997487499,
    997487567,
    997487759,
    997487783,
    517300057,
    517300046,
    517600034,
    517600223,
    520000093,
)
"""Programs of a fresh campaign that failed with incrementalize's option sets only (issue 38):
nodes vectorized over ``t`` that read all ``T`` rows of a node vectorized over ``t``
(``batch[t=0:T]``: one-hot masks ``EQ(comp[0:T], s)`` of gradients of reads at another
point of ``t``, and in 997487759 an ``IDENTITY`` of such a read) were tiled into blocks of
one row that still read all rows (``PDGError`` from ``verify_pdg``).
517300057 (JAX): a read at ``max(t - 1, 0)`` of a block of an incrementalized node, in the
loop over the blocks inside the loop over ``t``: at ``t = 0`` the read is of its own point,
so the block loop was scanned with the source kept inside the scan, never stored; at
``t = 1`` the loop ran unscanned and missed it (``RuntimeExecutionError``, runtime/scan.py).
517300046 (Torch, with swapping): a region wrote its result into a donated tensor whose
host copy the store kept for an earlier offload of another point holding it; offloading
the result reused that stale copy (wrong ``w.grad``, runtime/store.py).
517600034, 517600223 (dynamic ``T``): a statement placed by ``T`` before ``T`` is known
(``BoundError`` on ``if (T == 1)``): the blocks of a matmul isl put at ``T + di``
(schedule/bound_known.py), and the free of a block over ``(di,)`` alone placed after its
last reader before that step's bound setter (schedule/dealloc.py); reduced in
``tests/reliability/test_repros_38.py``.
520000093: a suffix sum ``x1[t:T].sum(0)`` of 2-vectors became a view of a ``SUFFIX_SUM``'s
rows (``pdg/passes/suffix_scan.py``); tiling the vectors' axis cut the view's input as if
the rows were a per-point axis too (``PDGError``: per-point shape (2, 1) for (1,);
``incrementalize._rows_to_batch``)."""


@pytest.mark.parametrize("opts", [o for o in _option_sets(long=True) if "incrementalize" in o], ids=str)
@pytest.mark.parametrize("seed", INCREMENTALIZE_SEEDS)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_fuzz_incrementalize_regressions(seed: int, backend: str, opts: dict[str, Any]) -> None:
    assert check_program(generate(seed), backend, opts) > 0


def test_a_program_that_overflows_is_ill_conditioned() -> None:
    """Seed 518000235: ``x5[t] = (x5[t + 1] - ...) * x5[t + 1]`` squares itself to inf at
    ``i = 1`` (and ``w.grad`` to nan); float32 rounding there is not comparable, so the
    program is skipped like a comparison on its threshold (it counted as a mismatch)."""
    with pytest.raises(IllConditioned, match="not finite"):
        expected(generate(518000235))

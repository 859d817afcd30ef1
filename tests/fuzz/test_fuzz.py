"""Differential fuzzing: random well-defined programs, compiled by timerl with compile
options on and off on both backends, against the independent interpreter of
``fuzz_programs.py``.

The quick profile runs in the default test run; ``pytest -m fuzz`` runs the long one
(``TIMERL_FUZZ_PROGRAMS`` programs, default 150, every single option flipped).
"""

from __future__ import annotations

import os
import time
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
from fuzz_programs import FEATURES, Program, features, generate, reference, render

from timerl.compile import CompileOptions

W0 = np.array([0.3, -0.2], np.float32)
SWITCHES = [f.name for f in fields(CompileOptions) if f.type in ("bool", bool)]
RTOL, ATOL = 2e-4, 2e-5
MARGIN = 1e-4  # a comparison closer than this to its threshold may go either way


class IllConditioned(Exception):
    """A comparison of the program sits within float rounding of its threshold."""


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
    ]
    if long:
        sets += [{name: False} for name in SWITCHES if {name: False} not in sets]
        # both memory passes together (memory_budget's last resort: blocks fetched per block)
        sets.append({"incrementalize": 8, "swap": True, "swap_threshold": 1})
    return sets


def expected(prog: Program) -> dict[str, dict]:
    """The interpreter's values for ``prog``; :class:`IllConditioned` if a comparison sits
    on its threshold."""
    margins: list[float] = []
    want = reference(prog, W0, margins)
    if margins and min(margins) < MARGIN:
        raise IllConditioned(f"a comparison within {min(margins):.1e} of its threshold")
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
            np.testing.assert_allclose(g, v, rtol=RTOL, atol=ATOL, err_msg=f"{name} at {pt}")
            n += 1
    return n


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


def test_fuzz_quick() -> None:
    """A few programs, all options on and all off, both backends."""
    stats = _run(QUICK_SEEDS, long=False)
    assert not stats["failures"], "\n\n".join(stats["failures"])
    assert stats["ill_conditioned"] == 0  # every feature of the quick profile is checked


@pytest.mark.fuzz
def test_fuzz_long() -> None:
    n = int(os.environ.get("TIMERL_FUZZ_PROGRAMS", "150"))
    start = int(os.environ.get("TIMERL_FUZZ_START", "1000"))
    stats = _run(range(start, start + n), long=True, progress=True)
    print(
        f"\nfuzz: {stats['programs']} programs ({stats['ill_conditioned']} skipped as ill-conditioned), "
        f"{stats['compiles']} compiles, {stats['checks']} checks, {len(stats['failures'])} failures, {stats['seconds']}s"
    )
    assert not stats["failures"], "\n\n".join(stats["failures"][:10])


REGRESSION_SEEDS = (9058,)
"""Programs of long runs that failed before their fix, checked with the defaults on every run.

9058: statements over ``(i, t)`` under a per-``i`` dynamic ``T`` that read nothing along
``i``; isl put the ``t`` loop outside the ``i`` loop, so one ``T`` bounded every episode
(``scheduler.episode_order_edges``)."""


@pytest.mark.parametrize("seed", REGRESSION_SEEDS)
@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_fuzz_regressions(seed: int, backend: str) -> None:
    prog = generate(seed)
    assert check_program(prog, backend, {}) > 0

"""Real TVM builds of tiny layers, checked against NumPy; invalid configurations recorded."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from timerl.envs.release import measure as rm
from timerl.envs.release.space import Layer, template_space

pytest.importorskip("tvm")

TINY = [
    Layer.conv2d("tiny_conv", 4, 8, 6, 3, 1, 1),
    Layer.conv2d("tiny_s2", 4, 8, 8, 1, 2, 0),
    Layer.matmul("tiny_mm", 16, 32, 8),
]


@pytest.fixture(scope="module")
def measurer() -> rm.TemplateMeasurer:
    return rm.TemplateMeasurer(repeats=3, repeat_ms=0.2)


@pytest.mark.parametrize("lay", TINY, ids=lambda lay: lay.name)
def test_random_configs_are_valid_and_timed(measurer: rm.TemplateMeasurer, lay: Layer) -> None:
    """Random configurations (all knobs, parallel and unroll included) build, match NumPy
    (the measurer checks it) and get a positive GFLOPS; a repeat is answered from the cache."""
    sp = template_space(lay)
    rng = np.random.default_rng(1)
    for _ in range(4):
        c = sp.random(rng)
        m = measurer.measure(sp, c)
        assert m.valid, m.error
        assert m.gflops > 0 and m.seconds > 0
        assert measurer.measure(sp, c) is m


def test_wrong_result_is_invalid(
    measurer: rm.TemplateMeasurer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel whose output differs from NumPy is recorded invalid with 0 GFLOPS (never
    timed) and logged: here the reference is perturbed, so every kernel is 'wrong'."""
    lay = Layer.matmul("tiny_mm_wrong", 8, 8, 8)
    a, b, ref = rm.layer_inputs(lay)
    monkeypatch.setattr(rm, "layer_inputs", lambda layer, seed=0: (a, b, ref + 0.5))
    sp = template_space(lay)
    with caplog.at_level(logging.WARNING, logger="timerl.envs.release"):
        m = measurer.measure(sp, sp.random(np.random.default_rng(0)))
    assert not m.valid and m.gflops == 0.0
    assert "wrong result" in m.error and "is invalid" in caplog.text


def test_build_failure_and_out_of_space_are_invalid(
    measurer: rm.TemplateMeasurer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration outside the space, and one whose TVM build fails, are invalid."""
    sp = template_space(Layer.matmul("tiny_mm_fail", 8, 8, 8))
    out = measurer.measure(sp, (99, 0, 0, 0, 0, 0, 0))
    assert not out.valid and "outside the knob space" in out.error

    def broken(space, cfg, target):
        raise RuntimeError("LLVM exploded")

    monkeypatch.setattr(rm.template, "build", broken)
    m = measurer.measure(sp, (0, 0, 0, 0, 0, 0, 0))
    assert not m.valid and m.gflops == 0.0 and "LLVM exploded" in m.error


def test_cpu_clock_and_median_estimator() -> None:
    """The CPU-time clock with the median estimator times a valid configuration; an invalid
    one is still recorded invalid (never timed); a bad clock or estimator raises."""
    m = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, clock="cpu", estimator="median")
    sp = template_space(TINY[2])
    good = m.measure(sp, sp.random(np.random.default_rng(0)))
    assert good.valid and good.gflops > 0
    bad = m.measure(sp, (99,) + (0,) * (len(sp.knobs) - 1))
    assert not bad.valid and bad.gflops == 0.0
    with pytest.raises(rm.TimeRLError, match="clock"):
        rm.TemplateMeasurer(clock="tsc")


def test_in_fresh_thread_returns_and_reraises() -> None:
    """``in_fresh_thread`` runs the function in another thread, returns its value and re-raises
    its exception in the caller."""
    main = threading.get_ident()
    assert rm.in_fresh_thread(threading.get_ident) != main

    def boom() -> None:
        raise RuntimeError("kernel crashed")

    with pytest.raises(RuntimeError, match="kernel crashed"):
        rm.in_fresh_thread(boom)


def test_fresh_timing_thread(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The default measurer (session 7: CPU clock, fresh thread) checks and times every
    configuration in a new thread, not the caller's, with the same timing rule; its GFLOPS agree
    with the caller-thread rule's on a tiny configuration; a wrong result found in the thread
    is still recorded invalid (0 GFLOPS, logged); a bad thread setting raises."""
    seen: list[str] = []
    real = rm.time_call

    def spy(*a, **k):
        seen.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(rm, "time_call", spy)
    fresh = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2)
    assert (fresh.clock, fresh.estimator, fresh.thread) == ("cpu", "min", "fresh")
    caller = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, thread="caller")
    sp = template_space(TINY[0])
    c = sp.random(np.random.default_rng(3))
    f, g = fresh.measure(sp, c), caller.measure(sp, c)
    assert f.valid and g.valid, (f.error, g.error)
    assert seen == ["release-timing", threading.current_thread().name]
    assert 0.5 < f.gflops / g.gflops < 2.0

    lay = Layer.matmul("tiny_mm_wrong_fresh", 8, 8, 8)
    a, b, ref = rm.layer_inputs(lay)
    monkeypatch.setattr(rm, "layer_inputs", lambda layer, seed=0: (a, b, ref + 0.5))
    sw = template_space(lay)
    with caplog.at_level(logging.WARNING, logger="timerl.envs.release"):
        m = fresh.measure(sw, sw.random(np.random.default_rng(0)))
    assert not m.valid and m.gflops == 0.0 and "wrong result" in m.error and "is invalid" in caplog.text
    assert len(seen) == 2  # never timed
    with pytest.raises(rm.TimeRLError, match="thread"):
        rm.TemplateMeasurer(thread="pool")


_REPRO = """
import json
from timerl.envs.release import template
from timerl.envs.release.measure import TemplateMeasurer
from timerl.envs.release.space import layer, template_space
sp = template_space(layer("C12"))
m = TemplateMeasurer()
print(json.dumps(m.time_lib(sp.layer, template.build(sp, (3, 1, 1, 3, 0, 1, 0, 1, 1, 0), m.target))))
"""


@pytest.mark.slow
def test_two_speed_configuration_reproduces_across_processes() -> None:
    """C12's two-speed configuration (57.6, 48.0 or 30.6 GFLOPS in the main thread, drawn per
    process) timed by the default measurer in three processes: one speed (within 10 %)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TVM_NUM_THREADS": "1"}
    out = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", _REPRO], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
        for _ in range(3)
    ]
    assert max(out) / min(out) < 1.1, out

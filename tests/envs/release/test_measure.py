"""Real TVM builds of tiny layers, checked against NumPy; invalid configurations recorded."""

from __future__ import annotations

import logging

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

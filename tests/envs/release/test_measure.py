"""Real TVM builds of tiny layers, checked against NumPy; invalid configurations recorded."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import platform
import shutil
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


def _measure_wrong(
    measurer: rm.TemplateMeasurer,
    name: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> rm.Measurement:
    """A random configuration of an 8 x 8 x 8 matmul measured against a perturbed reference
    (so its output is 'wrong'), with the warnings captured."""
    lay = Layer.matmul(name, 8, 8, 8)
    a, b, ref = rm.layer_inputs(lay)
    monkeypatch.setattr(rm, "layer_inputs", lambda layer, seed=0: (a, b, ref + 0.5))
    sp = template_space(lay)
    with caplog.at_level(logging.WARNING, logger="timerl.envs.release"):
        return measurer.measure(sp, sp.random(np.random.default_rng(0)))


def test_wrong_result_is_invalid(
    measurer: rm.TemplateMeasurer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel whose output differs from NumPy is recorded invalid with 0 GFLOPS (never
    timed) and logged: here the reference is perturbed, so every kernel is 'wrong'."""
    m = _measure_wrong(measurer, "tiny_mm_wrong", caplog, monkeypatch)
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
    configuration in a new thread, not the caller's, with the same timing rule; a wrong result
    found in the thread is still recorded invalid (0 GFLOPS, logged); a bad thread setting
    raises."""
    seen: list[str] = []
    real = rm.time_call

    def spy(*a, **k):
        seen.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(rm, "time_call", spy)
    fresh = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, stack_offsets=(0,))
    assert rm.TemplateMeasurer().clock == "cpu" and rm.TemplateMeasurer().thread == "fresh"
    caller = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, thread="caller", stack_offsets=(0,))
    sp = template_space(TINY[0])
    c = sp.random(np.random.default_rng(3))
    f, g = fresh.measure(sp, c), caller.measure(sp, c)
    assert f.valid and g.valid, (f.error, g.error)
    assert seen == ["release-timing", threading.current_thread().name]
    # both timed the same configuration (how close their GFLOPS are is a timing, which
    # depends on the machine's load: not asserted here)
    assert f.config == g.config and np.isfinite(f.gflops) and f.gflops > 0 and g.gflops > 0

    m = _measure_wrong(fresh, "tiny_mm_wrong_fresh", caplog, monkeypatch)
    assert not m.valid and m.gflops == 0.0 and "wrong result" in m.error and "is invalid" in caplog.text
    assert len(seen) == 2  # never timed
    with pytest.raises(rm.TimeRLError, match="thread"):
        rm.TemplateMeasurer(thread="pool")


NO_CC = not any(shutil.which(c) for c in ("cc", "gcc", "clang"))


@pytest.mark.skipif(platform.machine() != "x86_64" or sys.platform != "linux", reason="reads RSP")
@pytest.mark.skipif(NO_CC, reason="the padcall helper needs a C compiler")
def test_padcall_moves_the_stack() -> None:
    """``padcall(offset, fn)`` runs ``fn`` with the stack pointer ``offset`` bytes lower (read
    by glibc's ``getcontext``: RSP at byte 160 of ``ucontext_t``), returns its value and
    re-raises its exception."""
    libc = ctypes.CDLL(None)
    buf = ctypes.create_string_buffer(1024)

    def rsp() -> int:
        assert libc.getcontext(buf) == 0
        return int.from_bytes(buf.raw[160:168], "little")

    base = rm.padcall(0, rsp)
    assert [base - rm.padcall(o, rsp) for o in (16, 32, 48, 1024)] == [16, 32, 48, 1024]

    def boom() -> None:
        raise ValueError("inside the helper")

    with pytest.raises(ValueError, match="inside the helper"):
        rm.padcall(16, boom)


@pytest.mark.skipif(NO_CC, reason="the padcall helper needs a C compiler")
def test_stack_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default measurer times a configuration at the four stack offsets, which share the
    timing budget (a quarter of the repeats each, one warm-up in all), and keeps the fastest;
    ``stack_offsets=(0,)`` calls directly with the whole budget; bad offsets raise."""
    calls: list[int] = []
    rules: list[tuple] = []
    secs = iter([4e-3, 3e-3, 5e-3, 6e-3])
    real = rm.padcall
    monkeypatch.setattr(rm, "padcall", lambda o, fn: calls.append(o) or real(o, fn))

    def fake_time_call(lib, dev, args, once, repeats, min_repeats, repeat_ms, clock, estimator, warmup=True):
        rules.append((repeats, min_repeats, warmup))
        return next(secs)

    monkeypatch.setattr(rm, "time_call", fake_time_call)
    sp = template_space(TINY[2])
    c = sp.random(np.random.default_rng(5))
    m = rm.TemplateMeasurer(repeats=20, repeat_ms=0.2).measure(sp, c)
    assert m.valid and calls == [0, 16, 32, 48]
    assert rules == [(5, 1, True), (5, 1, False), (5, 1, False), (5, 1, False)]
    assert m.gflops == pytest.approx(sp.layer.flops / 3e-3 / 1e9)
    calls.clear(), rules.clear()
    secs = iter([2e-3])
    assert rm.TemplateMeasurer(stack_offsets=(0,)).measure(sp, c).valid and not calls
    assert rules == [(20, 3, True)]
    with pytest.raises(rm.TimeRLError, match="stack offsets"):
        rm.TemplateMeasurer(stack_offsets=())


_REPRO = """
import json
from timerl.envs.release import template
from timerl.envs.release.measure import TemplateMeasurer
from timerl.envs.release.space import layer, template_space
m = TemplateMeasurer()
out = []
for name, cfg in (("C12", (3, 1, 1, 3, 0, 1, 0, 1, 1, 0)), ("C2", (3, 0, 7, 0, 0, 0, 0, 1, 0, 1))):
    sp = template_space(layer(name))
    out.append(m.time_lib(sp.layer, template.build(sp, cfg, m.target)))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_two_speed_configurations_reproduce_across_processes() -> None:
    """Two configurations with a speed drawn per process when timed in the main thread at one
    stack offset (C12's: 57.6, 48.0 or 30.6 GFLOPS; C2's: 65, 45 or 31), timed by the default
    measurer in three processes: one speed each (within 10 %), the fastest (> 52, > 58)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TVM_NUM_THREADS": "1"}
    out = np.array(
        [
            json.loads(
                subprocess.run(
                    [sys.executable, "-c", _REPRO], env=env, capture_output=True, text=True, check=True
                ).stdout
            )
            for _ in range(3)
        ]
    )
    assert (out.max(0) / out.min(0) < 1.1).all() and (out.min(0) > [52, 58]).all(), out


def _counting_builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every ``template.build`` call recorded (the real build still runs)."""
    builds: list[tuple] = []
    real = rm.template.build
    monkeypatch.setattr(
        rm.template, "build", lambda sp, cfg, t: builds.append(tuple(cfg)) or real(sp, cfg, t)
    )
    return builds


def test_table_answers_a_second_measurer_without_building(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measurer with a table measures for real and records each configuration (an invalid one
    as invalid, with its error); a second measurer over the same file builds nothing and returns
    the recorded measurements (GFLOPS, validity, error and seconds), counted as table hits."""
    builds = _counting_builds(monkeypatch)
    path = tmp_path / "t.jsonl"
    sp = template_space(TINY[2])
    rng = np.random.default_rng(3)
    cfgs = list(dict.fromkeys(sp.random(rng) for _ in range(3))) + [(99,) + (0,) * (len(sp.knobs) - 1)]
    a = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, stack_offsets=(0,), table=path)
    first = [a.measure(sp, c) for c in cfgs]
    assert a.measured == len(cfgs) and a.table_hits == 0 and len(builds) == len(cfgs) - 1
    assert not first[-1].valid and first[-1].gflops == 0.0 and "outside the knob space" in first[-1].error
    assert all(m.valid for m in first[:-1])
    assert len(path.read_text().splitlines()) == len(cfgs)
    builds.clear()
    b = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, stack_offsets=(0,), table=path)
    again = [b.measure(sp, c) for c in cfgs]
    assert builds == [] and b.measured == 0 and b.table_hits == len(cfgs) and b.asks == len(cfgs)
    assert again == first  # gflops, valid, seconds and error as recorded
    assert b.measure(sp, cfgs[0]) is again[0] and b.table_hits == len(cfgs)  # then the in-memory cache


def test_table_keys_records_by_measurer_settings(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measurer with other settings (here the wall clock) does not use the records of another
    rule: it measures for real and adds its own; each rule then reads back only its own."""
    builds = _counting_builds(monkeypatch)
    path = tmp_path / "t.jsonl"
    sp = template_space(TINY[2])
    c = sp.random(np.random.default_rng(4))
    rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, stack_offsets=(0,), table=path).measure(sp, c)
    wall = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, stack_offsets=(0,), clock="wall", table=path)
    assert wall.table is not None and len(wall.table) == 0 and wall.table.foreign == 1
    wall.measure(sp, c)
    assert wall.measured == 1 and wall.table_hits == 0 and len(builds) == 2
    cpu = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, stack_offsets=(0,), table=path)
    wall2 = rm.TemplateMeasurer(repeats=3, repeat_ms=0.2, stack_offsets=(0,), clock="wall", table=path)
    for m in (cpu, wall2):
        assert m.table is not None and len(m.table) == 1 and m.table.foreign == 1
        m.measure(sp, c)
        assert m.table_hits == 1 and m.measured == 0
    assert len(builds) == 2


def test_table_tolerates_a_truncated_last_line(tmp_path, caplog: pytest.LogCaptureFixture) -> None:
    """A last line cut short (a process killed mid-write) is left unread; the next record starts
    on a line of its own, after which the cut line is skipped with a warning and every complete
    record is read back. Records another process appends are seen by ``get``."""
    path = tmp_path / "t.jsonl"
    lay = TINY[2]
    t = rm.MeasurementTable(path, "s")
    t.add(lay, rm.Measurement((1, 2), 3.5, True, 0.25))
    t.add(lay, rm.Measurement((1, 3), 0.0, False, 0.125, "wrong result"))
    with path.open("a") as f:
        f.write('{"settings": "s", "layer": "tiny_mm:matmul:16,32,8", "config": [1, ')
    u = rm.MeasurementTable(path, "s")
    assert len(u) == 2 and u.skipped == 0
    assert u.get(lay, (1, 3)) == rm.Measurement((1, 3), 0.0, False, 0.125, "wrong result")
    u.add(lay, rm.Measurement((2, 2), 7.0, True, 0.5))
    assert t.get(lay, (2, 2)) == rm.Measurement((2, 2), 7.0, True, 0.5)  # appended by another
    with caplog.at_level(logging.WARNING, logger="timerl.envs.release"):
        v = rm.MeasurementTable(path, "s")
    assert len(v) == 3 and v.skipped == 1 and "does not parse" in caplog.text
    assert v.get(lay, (1, 2)) == rm.Measurement((1, 2), 3.5, True, 0.25)
    assert rm.MeasurementTable(path, "other").foreign == 3

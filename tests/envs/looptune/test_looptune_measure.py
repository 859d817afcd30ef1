"""LoopTune measurement: TVM lowering == NumPy, caches, failures, the analytic model.

No timing is asserted anywhere (the machine is shared): only correctness, caching and
error handling.
"""

from __future__ import annotations

import json
import logging
import math
import re

import numpy as np
import pytest

from timerl.envs.looptune import measure, tvm_lower
from timerl.envs.looptune.ir import ACTIONS, LoopState, Problem, apply_action, initial_state
from timerl.envs.looptune.kernels import BMM, CONV1D, CONV2D, einsum_reference, parse_kernel
from timerl.envs.looptune.measure import AnalyticCostModel, TVMMeasurer
from timerl.errors import TimeRLError

tvm = pytest.importorskip("tvm", reason="the LoopTune TVM measurer needs pip install 'timerl[looptune]'")

A = {name: i for i, name in enumerate(ACTIONS)}


def run(state: LoopState, *names: str) -> LoopState:
    for name in names:
        state = apply_action(state, A[name])
    return state


def random_states(p: Problem, count: int, length: int, seed: int) -> list[LoopState]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        s = initial_state(p)
        for _ in range(length):
            s = apply_action(s, int(rng.integers(len(ACTIONS))))
        out.append(s)
    return out


def compiled_result(state: LoopState, target: object) -> tuple[np.ndarray, np.ndarray]:
    """The compiled schedule's output and NumPy's (``A @ B`` for matmul; for other kernels
    the brute-force einsum over the index expressions, independent of the lowering)."""
    p = state.problem
    k, ext = p.kernel, p.extents
    rng = np.random.default_rng(1)
    a = rng.uniform(-1, 1, k.lhs.shape(ext)).astype(np.float32)
    b = rng.uniform(-1, 1, k.rhs.shape(ext)).astype(np.float32)
    dev = tvm.cpu(0)
    c = tvm.runtime.tensor(np.full(k.out.shape(ext), np.nan, np.float32), dev)
    lib = tvm_lower.build(state, target).jit()
    lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), c)
    if k.name == "mm":
        return c.numpy(), a.astype(np.float64) @ b.astype(np.float64)
    return c.numpy(), einsum_reference(k, a, b, ext)


@pytest.mark.parametrize("shape", [(16, 24, 20), (32, 48, 40), (64, 80, 96)])
def test_random_schedules_compute_the_matmul(shape: tuple[int, int, int]) -> None:
    """Random action sequences (splits with tails, swaps in both nests) lower to TIR that
    computes exactly ``A @ B`` (every element of C written: C starts as NaN)."""
    target = tvm_lower.host_target()
    states = random_states(Problem(*shape), count=6, length=14, seed=sum(shape))
    states.append(run(initial_state(Problem(*shape)), "down", "down", "split_8", "swap_up", "swap_up"))
    assert len({s.schedule_key for s in states}) > 3
    for s in states:
        out, ref = compiled_result(s, target)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=s.key)


@pytest.mark.parametrize("shape", [(37, 53, 29), (13, 113, 7), (50, 77, 61)])
def test_remainder_loops_on_odd_sizes(shape: tuple[int, int, int]) -> None:
    """Odd sizes: every split leaves a tail, lowered as a main loop plus a remainder loop;
    the result is ``A @ B`` and no loop body holds a bounds guard."""
    target = tvm_lower.host_target()
    p = Problem(*shape)
    states = random_states(p, count=5, length=16, seed=sum(shape))
    states.append(
        run(initial_state(p), "split_8", "down", "swap_down", "down", "split_32", "swap_up", "swap_up")
    )
    states.append(
        run(initial_state(p), "split_4", "split_2", "down", "down", "split_16", "split_2", "down", "down")
    )
    assert any("r" in lp.text for s in states for lp in s.loops)  # tails exist
    for s in states:
        text = tvm_lower.script(s)
        assert "T.where" not in text and "if " not in text, text
        out, ref = compiled_result(s, target)
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4, err_msg=s.key)


def test_remainder_loop_structure() -> None:
    """``for n in 3 r 16 / for n' in 32`` (n = 112): a main loop of 3 x 32 vector lanes,
    then a 16-lane remainder at offset 96; a 48-lane remainder runs as 32 + 16 lanes."""
    p = Problem(208, 112, 240)
    s = run(initial_state(p), "split_8", "down", "swap_down", "down", "split_32", "swap_up", "swap_up")
    assert [lp.text for lp in s.loops[:5]] == ["m26", "n3r16", "k240", "m8", "n32"]
    text = tvm_lower.script(s)
    assert "for n0 in range(3):" in text
    assert "for n1 in T.vectorized(32):" in text and "for n1 in T.vectorized(16):" in text
    assert "B[k0, n1 + 96]" in text
    s64 = run(initial_state(p), "split_4", "down", "swap_down", "down", "split_64", "swap_up", "swap_up")
    assert [lp.text for lp in s64.loops[:5]] == ["m52", "n1r48", "k240", "m4", "n64"]
    text = tvm_lower.script(s64)
    assert "T.vectorized(64)" in text and "T.vectorized(32)" in text and "B[k0, n1 + 96]" in text
    assert "T.vectorized(48)" not in text


def test_unroll_cap() -> None:
    with pytest.raises(TimeRLError, match="unroll_max_step"):
        tvm_lower.lower(initial_state(Problem(16, 16, 16)), unroll_max_step=1024)
    out, ref = compiled_result(initial_state(Problem(16, 16, 16)), tvm_lower.host_target())
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)


def fast_measurer(tmp_path: object, **kw: object) -> TVMMeasurer:
    return TVMMeasurer(cache_dir=tmp_path, repeats=3, min_repeats=3, repeat_ms=0.2, **kw)  # type: ignore[arg-type]


def test_tvm_measurer_caches_in_memory_and_on_disk(tmp_path: object) -> None:
    p = Problem(16, 32, 16)
    m = fast_measurer(tmp_path)
    s = initial_state(p)
    g = m.gflops(s)
    assert g > 0 and m.stats.measured == 1
    assert m.gflops(run(s, "down")) == g  # the cursor does not change the schedule
    assert m.stats.memory_hits == 1 and m.stats.measured == 1
    lines = m.disk.path.read_text().splitlines()  # type: ignore[union-attr]
    assert [json.loads(x) for x in lines] == [{"key": s.schedule_key, "gflops": g}]
    again = fast_measurer(tmp_path)
    assert again.gflops(s) == g and again.stats.disk_hits == 1 and again.stats.measured == 0


def test_measure_failure_is_logged_and_zero(tmp_path: object, monkeypatch, caplog) -> None:
    m = fast_measurer(tmp_path)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("LLVM exploded")

    monkeypatch.setattr(tvm_lower, "build", broken)
    s = initial_state(Problem(16, 16, 16))
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        assert m.gflops(s) == 0.0
    assert "LLVM exploded" in caplog.text and s.schedule_key in caplog.text
    assert m.stats.failures == 1
    assert not m.disk.path.exists()  # type: ignore[union-attr]  # failures are not cached on disk


def test_wrong_result_is_logged_and_zero(tmp_path: object, monkeypatch, caplog) -> None:
    def wrong_reference(p: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, n, k = (p.extent(d) for d in "mnk")
        return np.ones((m, k), np.float32), np.ones((k, n), np.float32), np.zeros((m, n))

    monkeypatch.setattr(measure, "problem_inputs", wrong_reference)
    m = fast_measurer(tmp_path, disk_cache=False)
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        assert m.gflops(initial_state(Problem(16, 16, 16))) == 0.0
    assert "wrong result" in caplog.text


def test_corrupt_cache_is_reported_and_rebuilt(tmp_path: object, caplog) -> None:
    """Lines that are not a ``{"key": str, "gflops": finite >= 0}`` record are dropped with one
    warning, the file is rewritten without them, and their schedules are measured again."""
    m = fast_measurer(tmp_path)
    good, bad = initial_state(Problem(16, 32, 16)), initial_state(Problem(16, 16, 16))
    g = m.gflops(good)
    path = m.disk.path  # type: ignore[union-attr]
    with path.open("a") as f:
        for value in ("NaN", "-3.0", "1e999"):
            f.write(f'{{"key": "{bad.schedule_key}", "gflops": {value}}}\n')
        f.write('{"key": 7, "gflops": 1.0}\n')
        f.write('{"gflops": 1.0}\n')
        f.write("\x00\x00garbage{{\n")
        f.write(f'{{"key": "{bad.schedule_key}", "gfl')  # a torn last line
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        again = fast_measurer(tmp_path)
    assert "7 corrupt line(s) dropped (1 valid kept)" in caplog.text and str(path) in caplog.text
    assert [json.loads(x) for x in path.read_text().splitlines()] == [{"key": good.schedule_key, "gflops": g}]
    assert again.gflops(good) == g and again.stats.disk_hits == 1
    assert again.gflops(bad) > 0 and again.stats.measured == 1  # measured, not read from the cache
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        third = fast_measurer(tmp_path)
    assert "corrupt" not in caplog.text and len(third.disk.values) == 2  # type: ignore[union-attr]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"x": 1.0})])
def test_corrupt_peak_cache_is_measured_again(tmp_path, caplog, content: str) -> None:
    cpu = tvm_lower.host_cpu()
    path = tmp_path / "peak.json"
    path.write_text(content if content != json.dumps({"x": 1.0}) else json.dumps({cpu: -1.0, "x": 1.0}))
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        peak = measure.machine_peak(tmp_path)
    assert "peak cache" in caplog.text and "corrupt" in caplog.text
    assert math.isfinite(peak) and peak > 0
    assert json.loads(path.read_text()) == {cpu: peak}


class WrongOnceSplit(TVMMeasurer):
    """The real measurer, checking every schedule with more loops than the untuned nest
    against a wrong reference (so TVM builds and runs it, and the check rejects it)."""

    def _measure(self, state: LoopState) -> float:
        if len(state.loops) == len(initial_state(state.problem).loops):
            return super()._measure(state)
        a, b, ref = self._arrays(state.problem)
        self._inputs[state.problem] = (a, b, ref + 1.0)
        try:
            return super()._measure(state)
        finally:
            self._inputs[state.problem] = (a, b, ref)


@pytest.mark.parametrize("reward", ["log", "best", "step"])
def test_a_schedule_that_mismatches_numpy_is_logged_and_never_rewarded(tmp_path, caplog, reward: str) -> None:
    import timerl as trl
    from timerl.envs.looptune.env import LoopTuneEnv

    m = WrongOnceSplit(disk_cache=False, repeats=3, min_repeats=3, repeat_ms=0.2)
    p = Problem(32, 32, 16)
    with trl.Context(dims=("i",)):
        env = LoopTuneEnv("mm", 1, problems=[p], measurer=m, reward=reward, peak=100.0, noise=0.0)
    st = env._state
    st.bind({})
    st.reset({"i": 0})
    acts = ["split_2", "down", "swap_down", "down", "down", "split_4", "up", "up", "up", "up"]
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        rewards = [float(st.step(np.array([A[a]]))[1]) for a in acts]
    assert "wrong result" in caplog.text and m.stats.failures >= 1
    assert rewards[2] <= 0.0 if reward == "step" else rewards[2] == 0.0  # m8, k, m2, n: wrong
    if reward != "step":
        assert all(r == 0.0 for r in rewards)  # nothing beats the untuned nest that works
    rec = env.history[-1]
    assert rec.best_key == rec.initial_key and rec.best_gflops == rec.initial_gflops > 0
    assert env.demonstrations == {}  # a failed schedule is no demonstration


def test_machine_peak_reads_its_cache(tmp_path) -> None:
    (tmp_path / "peak.json").write_text(json.dumps({tvm_lower.host_cpu(): 123.5}))
    assert measure.machine_peak(tmp_path) == 123.5


def test_numpy_gflops_runs() -> None:
    assert measure.numpy_gflops(Problem(64, 64, 64), repeats=3) > 0


def test_make_measurer() -> None:
    assert isinstance(measure.make_measurer("analytic"), AnalyticCostModel)
    m = AnalyticCostModel()
    assert measure.make_measurer(m) is m
    with pytest.raises(TimeRLError, match="'tvm', 'analytic'"):
        measure.make_measurer("gcc")


def test_analytic_model_is_deterministic_and_ranks_schedules() -> None:
    p = Problem(128, 128, 128)
    m1, m2 = AnalyticCostModel(), AnalyticCostModel()
    init = initial_state(p)
    k_inner = run(init, "down", "swap_down")  # m, n, k: a scalar reduction innermost
    tiled = run(init, "split_4", "down", "swap_down", "down", "split_32")
    assert m1.gflops(init) == m2.gflops(init) > 0
    assert m1.gflops(k_inner) < m1.gflops(init) < m1.gflops(tiled) <= m1.peak


def test_analytic_model_warns_outside_tests(monkeypatch, caplog) -> None:
    monkeypatch.delenv("PYTEST_CURRENT_TEST", raising=False)
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        AnalyticCostModel()
    assert "CI tests" in caplog.text


def test_gflops_many_builds_each_schedule_once_in_one_module(tmp_path, monkeypatch) -> None:
    """A rollout's repeated schedule keys (a cursor move; a split whose loops stay adjacent,
    the same canonical nest) are built once, all new ones in one module, never alone."""
    m = fast_measurer(tmp_path)
    s0 = initial_state(Problem(24, 32, 16))
    s1 = run(s0, "split_2", "down", "swap_down")  # m12, k, m2, n
    s2 = run(s1, "down", "split_8", "swap_up")  # m12, k, n4, m2, n8
    states = [s0, run(s0, "down"), run(s0, "split_4"), s1, run(s1, "up"), s2, s1]
    calls: list[list[str]] = []
    build_many = tvm_lower.build_many

    def counting(states: list[LoopState], *args: object, **kwargs: object) -> object:
        calls.append([s.schedule_key for s in states])
        return build_many(states, *args, **kwargs)

    def alone(*args: object, **kwargs: object) -> None:
        raise AssertionError("built alone")

    monkeypatch.setattr(tvm_lower, "build_many", counting)
    monkeypatch.setattr(tvm_lower, "build", alone)
    values = m.gflops_many(states)
    assert calls == [[s0.schedule_key, s1.schedule_key, s2.schedule_key]]
    assert m.stats.measured == 3 and m.stats.failures == 0 and len(m.disk.values) == 3  # type: ignore[union-attr]
    assert all(v > 0 for v in values)
    assert values == [m.gflops(s) for s in states]  # the same cache as gflops()
    assert values[0] == values[1] == values[2] and values[3] == values[4] == values[6]
    assert m.gflops_many(states) == values and len(calls) == 1  # measured: nothing built again
    assert measure.gflops_all(m, states) == values


def test_gflops_many_builds_alone_when_the_module_fails(tmp_path, monkeypatch, caplog) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("LLVM exploded")

    m = fast_measurer(tmp_path, disk_cache=False)
    s0 = initial_state(Problem(16, 16, 16))
    states = [s0, run(s0, "split_2", "down", "swap_down")]
    monkeypatch.setattr(tvm_lower, "build_many", broken)
    values = m.gflops_many(states)
    assert all(v > 0 for v in values) and m.stats.measured == 2 and m.stats.failures == 0


def test_gflops_many_wrong_results_measure_zero(tmp_path, monkeypatch, caplog) -> None:
    def wrong_reference(p: Problem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        m, n, k = (p.extent(d) for d in "mnk")
        return np.ones((m, k), np.float32), np.ones((k, n), np.float32), np.zeros((m, n))

    monkeypatch.setattr(measure, "problem_inputs", wrong_reference)
    m = fast_measurer(tmp_path, disk_cache=False)
    s0 = initial_state(Problem(16, 16, 16))
    with caplog.at_level(logging.WARNING, logger="timerl.envs.looptune"):
        assert m.gflops_many([s0, run(s0, "split_2", "down", "swap_down"), s0]) == [0.0, 0.0, 0.0]
    assert "wrong result" in caplog.text and m.stats.failures == 2 and m.stats.measured == 0


def test_gflops_all_measures_one_by_one_without_gflops_many() -> None:
    model = AnalyticCostModel()
    states = random_states(Problem(32, 48, 64), 5, 6, seed=2)
    assert measure.gflops_all(model, states) == [model.gflops(s) for s in states]


def test_gflops_many_times_fully_only_the_schedules_the_choice_is_between(tmp_path, monkeypatch) -> None:
    """Every new schedule gets SCREEN_REPEATS timed repeats; only those within SCREEN_KEEP
    of the fastest get the rest of the budget, and only theirs go to the disk cache."""
    m = TVMMeasurer(cache_dir=tmp_path, repeats=20, min_repeats=3, repeat_ms=0.2)
    s0 = initial_state(Problem(16, 32, 16))
    s1 = run(s0, "split_2", "down", "swap_down")
    s2 = run(s1, "down", "split_8", "swap_up")
    seconds = {"s0": 4e-6, "s1": 1e-6, "s2": 1.1e-6}  # s0 the slow untuned nest
    calls: list[tuple[str, int]] = []

    def fake_time(lib: object, name: str, args: object, once: float, repeats: int, min_repeats: int) -> float:
        calls.append((name, repeats))
        return seconds[name] * (1.0 if len(calls) <= 3 else 0.9)  # the full timing reads faster

    monkeypatch.setattr(m, "_time", fake_time)
    values = m.gflops_many([s0, s1, s2, s0])
    first = measure.SCREEN_REPEATS
    assert calls == [("s0", first), ("s1", first), ("s2", first), ("s1", 20 - first), ("s2", 20 - first)]
    flops = s0.problem.flops
    assert values == pytest.approx(
        [flops / 4e-6 / 1e9, flops / 0.9e-6 / 1e9, flops / 0.99e-6 / 1e9] + [values[0]]
    )
    assert set(m.disk.values) == {s1.schedule_key, s2.schedule_key}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "p",
    [
        Problem(37, 21, 19),
        Problem(3, 17, 9, 13, kernel=BMM),
        Problem(19, 12, 3, 5, kernel=CONV1D),
        Problem(9, 7, 6, 3, 2, 4, kernel=CONV2D),
        Problem(19, 12, 3, 5, kernel=parse_kernel("sconv", "X[2*i+r,c] * W[r,c,o] -> Y[i,o]", "iorc")),
        Problem(5, 7, 9, kernel=parse_kernel("tmm", "A[k,m] * B[n,k] -> C[n,m]", "mnk")),
    ],
    ids=lambda p: p.name,
)
def test_from_script_makes_the_function_the_parser_makes(p: Problem) -> None:
    """tvm_lower.lower builds each script with TVM's IR builder (from_script), not its
    parser: the same function (structurally equal, printed the same) for random schedules
    with remainders, split vectors, unrolling, every kernel."""
    texts = ""
    for s in [initial_state(p), *random_states(p, count=6, length=14, seed=sum(p.sizes))]:
        for lanes, unroll in ((64, 0), (8, 16)):
            text = tvm_lower.script(s, lanes, unroll)
            texts += text
            fast, parsed = tvm_lower.from_script(text), tvm_lower.parse_script(text)
            tvm.ir.assert_structural_equal(fast, parsed)
            assert fast.script() == parsed.script(), s.key
    assert "T.vectorized" in texts and "pragma_auto_unroll_max_step" in texts  # both were covered
    with pytest.raises(TimeRLError, match="not a LoopTune script"):
        tvm_lower.from_script("def main(): pass")


def _kernel_asm(module: object) -> list[str]:
    """The assembly of a built module's kernels (``*_compute_``), labels renumbered."""
    out, keep = [], False
    for line in module.mod.inspect_source("asm").splitlines():  # type: ignore[attr-defined]
        if re.match(r"^[A-Za-z_][\w.$]*:", line):
            keep = "compute" in line
        st = line.strip()
        if (
            keep
            and not st.startswith((".loc", ".cfi", ".p2align", "#"))
            and not re.match(r"^\.Ltmp\d+:$", st)
        ):
            out.append(
                re.sub(r"\.(LBB|LCPI|Ltmp|Lfunc_end|Lfunc_begin)\d+(_\d+)?", r".\1", line.split("#")[0])
            )
    return out


@pytest.mark.parametrize(
    "p", [Problem(64, 96, 80), Problem(37, 21, 19), Problem(3, 17, 9, 13, kernel=BMM)], ids=lambda p: p.name
)
def test_measuring_builds_without_argument_checks_run_the_same_kernel_code(p: Problem) -> None:
    """The measurer builds without the checks of the arguments (faster to compile): the
    kernels' machine code is the same as the checked build's."""
    target = tvm_lower.host_target()
    states = [initial_state(p), run(initial_state(p), "split_4", "down", "swap_down", "down", "split_16")]
    for s in states + random_states(p, count=3, length=12, seed=7):
        checked, bare = tvm_lower.build(s, target), tvm_lower.build(s, target, checks=False)
        asm = _kernel_asm(checked)
        assert len(asm) > 20 and asm == _kernel_asm(bare), s.key
        assert len(checked.mod.inspect_source("ll")) > len(bare.mod.inspect_source("ll"))  # checks gone
    out, ref = compiled_result(states[1], target)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4)
    lib = tvm_lower.build(states[0], target).jit()
    a = tvm.runtime.tensor(np.zeros((2, 2), np.float32), tvm.cpu(0))
    with pytest.raises(Exception, match=r"(?i)shape|mismatch|dim"):  # the user's module keeps them
        lib["main"](a, a, a)

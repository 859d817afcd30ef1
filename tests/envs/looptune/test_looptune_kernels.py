"""LoopTune beyond matmul: kernels from index expressions, their strides and features,
their lowering on odd sizes against NumPy, the datasets and the env on them."""

from __future__ import annotations

import numpy as np
import pytest

import timerl as trl
from timerl.envs.looptune import dataset
from timerl.envs.looptune.ir import (
    ACTIONS,
    LoopState,
    Problem,
    access_strides,
    apply_action,
    check,
    describe,
    features,
    initial_state,
)
from timerl.envs.looptune.kernels import (
    BMM,
    CONV1D,
    CONV2D,
    MM,
    einsum_reference,
    numpy_reference,
    parse_kernel,
)
from timerl.errors import TimeRLError

A = {name: i for i, name in enumerate(ACTIONS)}


def run(state: LoopState, *names: str) -> LoopState:
    for name in names:
        state = apply_action(state, A[name])
        check(state)
    return state


def random_states(p: Problem, count: int, length: int, seed: int) -> list[LoopState]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        s = initial_state(p)
        for _ in range(length):
            s = apply_action(s, int(rng.integers(len(ACTIONS))))
        check(s)
        out.append(s)
    return out


def test_kernels_from_index_expressions() -> None:
    assert MM.order == ("m", "k", "n") and MM.reduction_dims == ("k",) and MM.vector_dim == "n"
    assert BMM.order == ("b", "m", "k", "n")
    assert CONV1D.order == ("i", "r", "c", "o") and CONV1D.reduction_dims == ("r", "c")
    assert CONV2D.order == ("h", "w", "r", "s", "c", "o")
    ext = {"i": 10, "o": 4, "r": 3, "c": 5}
    assert CONV1D.lhs.shape(ext) == (12, 5) and CONV1D.rhs.shape(ext) == (3, 5, 4)
    # X[i+r, c]: i and r both move X by one row (c elements), c by one element
    assert [CONV1D.lhs.stride(d, ext) for d in "iorc"] == [5, 0, 5, 1]
    strided = parse_kernel("sconv", "X[2*i+r,c] * W[r,c,o] -> Y[i,o]")
    assert strided.lhs.shape(ext) == (2 * 9 + 2 + 1, 5) and strided.lhs.stride("i", ext) == 10
    p = Problem(112, 64, 3, 32, kernel=CONV1D)
    assert p.name == "conv1d_112x64x3x32" and Problem.from_name(p.name) == p
    assert p.flops == 2 * 112 * 64 * 3 * 32
    assert "T[i, o] += X[i + r, c] * W[r, c, o]" in describe(initial_state(p))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("A[m,k] * B[k,n] * D[n] -> C[m,n]", "3 operands"),
        ("A[m,k] * B[k,n] -> C[m+1,n]", "not supported"),
        ("A[m,k] * B[k,n] -> C[m,n,q]", "index no operand"),
        ("A[m,k] * B[k,n] -> C[n+m]", "distinct plain dims"),
        ("A[m,n] * B[m,n] -> C[m,n]", "no reduction dim"),
        ("A[m,k] * B[k,n]", "one '->'"),
        ("A[m,k] * A[k,n] -> C[m,n]", "distinct names"),
        ("A[i*j] * B[j] -> C[i]", "not supported"),
    ],
)
def test_unsupported_kernels_are_named(text: str, match: str) -> None:
    with pytest.raises(TimeRLError, match=match):
        parse_kernel("bad", text)


def test_problem_size_count_is_checked() -> None:
    with pytest.raises(TimeRLError, match="needs 4 sizes, one per dim i,o,r,c"):
        Problem(4, 5, 6, kernel=CONV1D)
    with pytest.raises(TimeRLError, match="unknown LoopTune kernel"):
        Problem.from_name("conv3d_1x2")


def test_strides_follow_the_index_expressions() -> None:
    """The features come from each tensor's index expressions: a matmul whose ``A`` is
    stored transposed (``A[k,m]``) has other strides, hence other features, than ``mm``
    at the same sizes, and ``conv1d``'s ``i`` loop moves ``X`` by ``c`` elements."""
    mm_t = parse_kernel("mmt", "A[k,m] * B[k,n] -> C[m,n]", "mnk")
    s, t = initial_state(Problem(64, 80, 96)), initial_state(Problem(64, 80, 96, kernel=mm_t))
    assert access_strides(s)[0] == [96, 80]  # m: A[m,k] row stride k, T[m,n] row stride n
    assert access_strides(t)[0] == [1, 80]  # m: A[k,m] unit stride
    assert access_strides(s)[1] == [1, 80] and access_strides(t)[1] == [64, 80]  # k
    assert not np.array_equal(features(s), features(t))
    c = initial_state(Problem(112, 64, 3, 32, kernel=CONV1D))
    # compute i, r, c, o: X[i+r,c] W[r,c,o] T[i,o]; write-back i, o: T[i,o] Y[i,o]
    assert access_strides(c) == [[32, 64], [32, 2048], [1, 64], [1, 1], [64, 64], [1, 1]]
    split = run(c, "down", "down", "down", "split_16")  # o -> o/16, o' 16: o strides x16
    assert access_strides(split)[3] == [16, 16]


ODD = [
    Problem(3, 13, 17, 7, kernel=BMM),
    Problem(2, 37, 21, 29, kernel=BMM),
    Problem(29, 13, 3, 7, kernel=CONV1D),
    Problem(37, 50, 5, 11, kernel=CONV1D),
    Problem(7, 9, 13, 3, 2, 5, kernel=CONV2D),
    Problem(11, 6, 19, 3, 3, 3, kernel=CONV2D),
]


@pytest.mark.parametrize("p", ODD, ids=lambda p: p.name)
def test_other_kernels_lower_to_tvm_and_match_numpy(p: Problem) -> None:
    """Random schedules of batched matmuls and convolutions on odd sizes (every split
    leaves a remainder loop) compute what NumPy computes: the im2col/matmul baseline and
    the brute-force einsum over the index expressions agree, and the TVM build of every
    schedule matches them (the output starts as NaN, so every element is written)."""
    tvm = pytest.importorskip("tvm", reason="needs pip install 'timerl[looptune]'")
    from timerl.envs.looptune import tvm_lower

    k, ext = p.kernel, p.extents
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, k.lhs.shape(ext)).astype(np.float32)
    b = rng.uniform(-1, 1, k.rhs.shape(ext)).astype(np.float32)
    ref = einsum_reference(k, a, b, ext)
    np.testing.assert_allclose(numpy_reference(k)(a.astype(np.float64), b.astype(np.float64)), ref, atol=1e-9)
    target = tvm_lower.host_target()
    dev = tvm.cpu(0)
    states = random_states(p, count=4, length=18, seed=sum(p.sizes))
    assert len({s.schedule_key for s in states}) > 2
    for s in states:
        text = tvm_lower.script(s)
        assert "T.where" not in text and " if " not in text, s.key
        out = tvm.runtime.tensor(np.full(ref.shape, np.nan, np.float32), dev)
        lib = tvm_lower.build(s, target).jit()
        lib["main"](tvm.runtime.tensor(a, dev), tvm.runtime.tensor(b, dev), out)
        np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-4, err_msg=s.key)


def test_user_kernel_is_measured_against_the_einsum_reference(tmp_path) -> None:
    """A kernel that is not built in (a strided convolution) lowers and measures through
    the same path; its reference is the brute-force einsum."""
    pytest.importorskip("tvm", reason="needs pip install 'timerl[looptune]'")
    from timerl.envs.looptune.measure import TVMMeasurer

    sconv = parse_kernel("sconv", "X[2*i+r,c] * W[r,c,o] -> Y[i,o]", "iorc")
    p = Problem(19, 12, 3, 5, kernel=sconv)
    m = TVMMeasurer(cache_dir=tmp_path, disk_cache=False, repeats=3)
    for s in [initial_state(p), *random_states(p, count=2, length=10, seed=3)]:
        assert m.gflops(s) > 0, s.key
    assert m.stats.failures == 0


def test_datasets_and_split() -> None:
    sizes = {"mm": 2197, "bmm": 192, "conv1d": 81, "conv2d": 54}
    for name, n in sizes.items():
        allp = dataset.problems(name)
        assert len(allp) == n and len(set(allp)) == n
        train, test = dataset.split(name)
        assert len(test) == -(-n // 5) and not set(train) & set(test)
        assert {p.kernel.name for p in allp} == {name}


@pytest.mark.parametrize("name", ["bmm", "conv1d", "conv2d"])
def test_env_runs_on_other_kernels(name: str) -> None:
    """``looptune.<kernel>`` envs step with the analytic model (CI), and the observation
    has the matmul env's shape, so a matmul-trained policy can act on them."""
    with trl.Context(dims=("t",)):
        env = trl.env.make(f"looptune.{name}", measurer="analytic", split="test")
        mm = trl.env.make("looptune.mm", measurer="analytic")
    assert env.obs_space.shape == mm.obs_space.shape
    st = env._state
    st.bind({})
    obs = st.reset({"i": 0})
    for a in ("down", "split_4", "swap_down", "down", "down", "split_8"):
        obs, rew, done = st.step(np.array([A[a]]))
        assert np.all(np.isfinite(rew))
    assert obs.reshape(-1).shape == env.obs_space.shape
    ep = st.episodes[0]
    assert ep.state.problem.kernel.name == name and ep.g > 0


def test_numpy_baseline_of_a_convolution_runs() -> None:
    pytest.importorskip("tvm", reason="needs pip install 'timerl[looptune]'")
    from timerl.envs.looptune.measure import numpy_gflops_batch

    out = numpy_gflops_batch(
        [Problem(56, 32, 3, 32, kernel=CONV1D), Problem(2, 48, 48, 48, kernel=BMM)], repeats=3
    )
    assert len(out) == 2 and min(out) > 0

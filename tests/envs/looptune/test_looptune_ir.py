"""LoopTune IR: action semantics and their no-op boundaries, tails, features, keys, dataset."""

from __future__ import annotations

import math

import numpy as np
import pytest

from timerl.envs.looptune import dataset
from timerl.envs.looptune.ir import (
    ACTIONS,
    MAX_LOOPS,
    LoopState,
    Nest,
    Problem,
    apply_action,
    check,
    describe,
    features,
    initial_state,
    is_valid,
)
from timerl.errors import TimeRLError

A = {name: i for i, name in enumerate(ACTIONS)}
P = Problem(64, 80, 96)


def run(state: LoopState, *names: str) -> LoopState:
    for name in names:
        state = apply_action(state, A[name])
        check(state)
    return state


def noop(state: LoopState, name: str) -> None:
    assert not is_valid(state, A[name])
    assert apply_action(state, A[name]) is state


def test_problem_and_initial_state() -> None:
    assert P.name == "mm_64x80x96" and P.flops == 2 * 64 * 80 * 96
    s = initial_state(P)
    assert s.key == "mm_64x80x96|c:m64,k96,n80|w:m64,n80|@0"
    assert s.schedule_key == "mm_64x80x96|c:m64,k96,n80|w:m64,n80"
    assert [(lp.dim, lp.nest) for lp in s.loops] == [
        ("m", Nest.COMPUTE),
        ("k", Nest.COMPUTE),
        ("n", Nest.COMPUTE),
        ("m", Nest.WRITE),
        ("n", Nest.WRITE),
    ]
    check(s)
    assert "for m in 64    <- cursor" in describe(s)


def test_cursor_moves_and_boundaries() -> None:
    s = initial_state(P)
    noop(s, "up")
    s = run(s, "down", "down", "down", "down")
    assert s.cursor == 4 and s.loops == initial_state(P).loops  # cursor moves change no loop
    noop(s, "down")
    assert run(s, "up").cursor == 3


def test_swaps_move_the_cursor_and_stay_in_their_nest() -> None:
    s = run(initial_state(P), "swap_down")  # m <-> k
    assert s.key == "mm_64x80x96|c:k96,m64,n80|w:m64,n80|@1"
    assert run(s, "swap_up").key == initial_state(P).key
    noop(initial_state(P), "swap_up")  # first loop
    last_compute = run(initial_state(P), "down", "down")
    noop(last_compute, "swap_down")  # would cross into the write-back nest
    first_write = run(last_compute, "down")
    noop(first_write, "swap_up")
    assert run(first_write, "swap_down").key == "mm_64x80x96|c:m64,k96,n80|w:n80,m64|@4"
    noop(run(first_write, "down"), "swap_down")  # last loop


def test_split_semantics_tails_and_limits() -> None:
    s = initial_state(P)
    noop(s, "split_64")  # factor must be smaller than the loop
    s = run(s, "split_32")
    assert s.key == "mm_64x80x96|c:m2,m32,k96,n80|w:m64,n80|@0"  # cursor stays on the outer loop
    noop(s, "split_2")  # 2 iterations: nothing left to split
    # 80 = 2 * 32 + 16: the tail is in elements, on the outer loop
    s = run(initial_state(P), "down", "down", "split_32")
    assert s.key == "mm_64x80x96|c:m64,k96,n2r16,n32|w:m64,n80|@2"
    noop(s, "swap_down")  # two loops of the same dim keep their order
    # nested: 80 -> n10 x n'8, then n10 -> n2 r16 x n''4 (16 = (10 % 4) * 8)
    s = run(initial_state(P), "down", "down", "split_8", "split_4")
    assert s.key == "mm_64x80x96|c:m64,k96,n2r16,n4,n8|w:m64,n80|@2"
    assert [lp.tail for lp in s.loops] == [0, 0, 16, 0, 0, 0, 0]
    # 96 = 1 * 64 + 32
    assert run(initial_state(P), "down", "split_64").key == "mm_64x80x96|c:m64,k1r32,k64,n80|w:m64,n80|@1"
    # splits in the write-back nest work the same way
    assert run(initial_state(P), "down", "down", "down", "split_16").key.endswith("|w:m4,m16,n80|@3")


def test_split_is_invalid_beyond_max_loops() -> None:
    s = initial_state(Problem(256, 256, 256))
    for _ in range(5):  # 5 loops + 5 splits = 10
        s = run(s, "split_2")
    assert len(s.loops) == 10
    assert not is_valid(s, A["split_2"], max_loops=10)
    assert apply_action(s, A["split_2"], max_loops=10) is s
    assert is_valid(s, A["split_2"])  # the default cap is MAX_LOOPS
    with pytest.raises(TimeRLError, match="max_loops"):
        features(s, max_loops=8)


def test_bad_action_index() -> None:
    with pytest.raises(TimeRLError, match="0..9"):
        is_valid(initial_state(P), 10)


def test_features_on_a_hand_checked_nest() -> None:
    s = run(initial_state(P), "down", "down", "split_32")  # m64 k96 n2r16 n'32 | m64 n80, cursor n
    f = features(s)
    assert f.shape == (MAX_LOOPS, 20) and f.dtype == np.float32
    third = 1.0 / 3.0
    want = np.zeros((6, 20), np.float32)
    # cursor, log2(size)/8, log2(1+tail)/8, compute, then histogram bins 2^0..2^15
    want[0, :4] = [0, 6 / 8, 0, 1]  # m: A stride 96, T stride 80 -> bin 6 twice
    want[0, 4 + 6] = 2 * third
    want[1, :4] = [0, math.log2(96) / 8, 0, 1]  # k: A stride 1 (bin 0), B stride 80 (bin 6)
    want[1, 4 + 0] = third
    want[1, 4 + 6] = third
    want[2, :4] = [1, 1 / 8, math.log2(17) / 8, 1]  # n (outer, 32 elements/iter): B, T stride 32
    want[2, 4 + 5] = 2 * third
    want[3, :4] = [0, 5 / 8, 0, 1]  # n': B, T stride 1
    want[3, 4 + 0] = 2 * third
    want[4, :4] = [0, 6 / 8, 0, 0]  # write-back m: T, C stride 80
    want[4, 4 + 6] = 2 * third
    want[5, :4] = [0, math.log2(80) / 8, 0, 0]  # write-back n: stride 1
    want[5, 4 + 0] = 2 * third
    np.testing.assert_allclose(f[:6], want, rtol=1e-6)
    assert not f[6:].any()  # padding rows


def test_large_strides_fall_in_the_last_bin() -> None:
    s = run(initial_state(Problem(256, 256, 256)), "down", "down", "split_2", "split_2")
    # outer n loop: 4 * ... elements per iteration; strides grow but stay in bins 0..15
    f = features(s)
    assert f[:, 4:].sum(axis=1)[: len(s.loops)].min() > 0  # every loop has some access


def test_key_identity_and_hashing() -> None:
    a = run(initial_state(P), "swap_down", "swap_up")
    b = initial_state(P)
    assert a == b and hash(a) == hash(b) and a.key == b.key
    assert {a: 1}[b] == 1
    assert run(b, "down").schedule_key == b.schedule_key != run(b, "down").key


def test_random_walks_keep_the_invariants() -> None:
    rng = np.random.default_rng(0)
    for p in (P, Problem(16, 24, 20), Problem(256, 64, 112)):
        s = initial_state(p)
        for _ in range(200):
            s = apply_action(s, int(rng.integers(len(ACTIONS))))
            check(s)
            assert features(s).shape == (MAX_LOOPS, 20)


def test_dataset_and_split() -> None:
    allp = dataset.problems("mm")
    assert len(allp) == 2197 and len(set(allp)) == 2197
    assert min(p.extent("m") for p in allp) == 64 and max(p.extent("k") for p in allp) == 256
    train, test = dataset.split("mm", seed=0)
    assert (len(train), len(test)) == (1757, 440)
    assert not set(train) & set(test)
    assert dataset.split("mm", seed=0) == (train, test)
    assert dataset.split("mm", seed=1)[1] != test


def test_unknown_dataset_names_the_valid_ones() -> None:
    with pytest.raises(TimeRLError, match="valid datasets: mm"):
        dataset.problems("conv")
    with pytest.raises(TimeRLError, match="valid datasets: mm"):
        dataset.split("conv")


def test_canonical_merges_directly_nested_loops_of_one_dim() -> None:
    from timerl.envs.looptune.ir import ACTIONS, Problem, apply_action, canonical, check, initial_state

    def play(s, *names):
        for n in names:
            s = apply_action(s, ACTIONS.index(n))
        return s

    p = Problem(208, 112, 240)
    init = initial_state(p)
    spam = play(init, "split_8", "split_2", "down", "down", "split_4")
    assert canonical(spam).schedule_key == init.schedule_key  # splits alone change nothing
    tile = play(init, "split_8", "down", "swap_down", "down", "split_32", "swap_up", "swap_up")
    assert canonical(tile) is tile  # nothing adjacent to merge
    # n3r16 directly over n32 merges back into n112; m26 over k over m8 stays split
    half = play(init, "split_8", "down", "swap_down", "down", "split_32")
    c = canonical(half)
    check(c)
    assert [lp.text for lp in c.loops if lp.nest.value == "c"] == ["m26", "k240", "m8", "n112"]
    assert c.loops[c.cursor].dim == "n"

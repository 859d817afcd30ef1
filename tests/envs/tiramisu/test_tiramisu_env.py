"""The env: rewards, illegal actions as logged no-ops that never reach the compiler,
errors for programs it cannot represent, the graph state, and a run as an RT program."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

import timerl as trl
from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu.actions import ACTIONS, NEXT, NUM_ACTIONS, apply_action
from timerl.envs.tiramisu.env import PENALTY, TiramisuTask, _TiramisuState
from timerl.envs.tiramisu.features import MAX_NODES, NUM_FEATURES, OBS_SIZE, graph, unflatten
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.program import Access, Array, Program, Statement, UnsupportedProgramError
from timerl.envs.tiramisu.schedule import initial_schedule

A = {a.name: k for k, a in enumerate(ACTIONS)}


@pytest.fixture(scope="module")
def measurer():
    return Measurer(disk_cache=False, threads=1)


def _state(programs, measurer, episode_len=8) -> _TiramisuState:
    st = _TiramisuState(
        "tiramisu.test", 1, 0, [TiramisuTask(p, measurer) for p in programs], True, episode_len
    )
    st.bind({})
    return st


def test_illegal_action_is_a_penalised_no_op_that_never_compiles(measurer, caplog) -> None:
    st = _state([bm.seidel2d(2, 30)], measurer)
    obs0 = st.reset({"i": 0})
    before = measurer.compiles
    with caplog.at_level(logging.DEBUG, logger="timerl.envs.tiramisu"):
        obs, r, d = st.step(np.array([A["I(0,1)"]]))  # t <-> i on seidel: illegal
    assert r == pytest.approx(math.log(0.9, 4)) and not d
    assert measurer.compiles == before
    np.testing.assert_array_equal(obs, obs0)
    assert "illegal" in caplog.text
    obs, r, d = st.step(np.array([A["I(3,4)"]]))  # level 3 does not exist
    assert r == pytest.approx(PENALTY) and measurer.compiles == before


def test_legal_action_reward_is_log4_speedup(measurer) -> None:
    st = _state([bm.jacobi2d(3, 64)], measurer)
    st.reset({"i": 0})
    ep = st.episodes[0]
    t0 = ep.t
    _, r, _ = st.step(np.array([A["T(1,2,32,32)"]]))
    assert ep.sched.key != ep.task.initial.key
    assert r == pytest.approx(math.log(t0 / ep.t, 4), rel=1e-5)
    # next: penalty, focus moves; next after the last branch ends the episode
    _, r, d = st.step(np.array([NEXT]))
    assert r == pytest.approx(PENALTY) and not d and ep.branch == 1
    _, r, d = st.step(np.array([NEXT]))
    assert d and len(st.history) == 1
    _, r, d = st.step(np.array([0]))  # done stays done with reward 0
    assert d and r == 0.0
    rec = st.history[0]
    assert rec.actions == (A["T(1,2,32,32)"], NEXT, NEXT) and rec.initial_seconds == t0


def test_mask(measurer) -> None:
    st = _state([bm.seidel2d(2, 20)], measurer)
    st.reset({"i": 0})
    structural = st.mask(legal=False)[0]
    legal = st.mask(legal=True)[0]
    assert structural[NEXT] == legal[NEXT] == 1.0
    assert structural[A["R(3)"]] == 0.0  # 3 loops only
    assert structural[A["I(0,1)"]] == 1.0 and legal[A["I(0,1)"]] == 0.0
    assert np.all(legal <= structural)


def test_mask_hides_actions_that_return_to_a_visited_schedule(measurer) -> None:
    st = _state([bm.cvtcolor(16, 16)], measurer)  # no dependences: every permutation is legal
    st.reset({"i": 0})
    assert st.mask(legal=True)[0][A["I(0,1)"]] == 1.0
    st.step(np.array([A["I(0,1)"]]))
    assert st.episodes[0].sched.key != st.episodes[0].task.initial.key
    for legal in (False, True):
        m = st.mask(legal=legal)[0]
        assert m[A["I(0,1)"]] == 0.0  # would restore the untransformed schedule
        assert m[A["R(1)"]] == 1.0
    st.step(np.array([A["R(1)"]]))
    m = st.mask(legal=False)[0]
    assert m[A["I(0,1)"]] == 1.0 and m[A["R(1)"]] == 0.0
    st.step(np.array([A["U(32)"]]))
    st.step(np.array([A["U(16)"]]))
    m = st.mask(legal=False)[0]
    assert m[A["U(32)"]] == 0.0 and m[A["U(8)"]] == 1.0  # no toggling back to a visited schedule


def test_graph_state() -> None:
    p = bm.doitgen(2, 2, 3)
    x, adj, mask = graph(initial_schedule(p), focus=1)
    n = int(mask.sum())
    assert n == 1 + (3 + 4 + 3) + 3  # root, loop levels per branch, statements
    assert x.shape == (MAX_NODES, NUM_FEATURES) and adj.shape == (MAX_NODES, MAX_NODES)
    assert np.all(adj == adj.T) and np.all(np.diag(adj)[:n] == 1) and adj[n:].sum() == 0
    comp = x[x[:, 0] == 1.0]
    assert len(comp) == 3
    # S1 writes sum[r, q, p]: rows (1 0 0 0 | 0), (0 1 0 0 | 0), (0 0 1 0 | 0)
    w = comp[1, 1 : 1 + 4 * 6].reshape(4, 6)
    np.testing.assert_array_equal(w[:3, :4], np.eye(4)[:3])
    flat = np.concatenate([x.reshape(-1), adj.reshape(-1), mask])
    assert flat.shape == (OBS_SIZE,)
    x2, adj2, m2 = unflatten(flat)
    np.testing.assert_array_equal(x2, x)


def test_graph_shows_shift_and_shared_loops() -> None:
    """Iterator nodes carry the level's shift and whether another branch runs inside the
    loop (jacobi2d's t loop from the start; after F(2) also i and j)."""
    from timerl.envs.tiramisu.features import COMP_FEATURES

    it0 = 1 + COMP_FEATURES
    p = bm.jacobi2d(2, 8)
    s = initial_schedule(p)
    for br, name in ((0, "S(0,1,2)"), (1, "S(0,1,2)"), (1, "Sh(1)")):
        s = apply_action(s, br, A[name])
    x, _, _ = graph(s, focus=1)
    iters = x[x[:, 0] == 0.0][1:7]  # the root, then 3 levels per branch
    assert list(iters[:, it0 + 7]) == [1, 0, 0, 1, 0, 0]  # only t is shared
    assert list(iters[:, it0 + 6] * 4) == [0, 0, 0, 0, 1, 0]  # S1's i level shifted by one
    x, _, _ = graph(apply_action(s, 1, A["F(2)"]), focus=1)
    assert list(x[x[:, 0] == 0.0][1:7, it0 + 7]) == [1] * 6


def test_unrepresentable_programs_raise_clear_errors() -> None:
    def prog(its, dom, write, reads=(), body="1.0f"):
        return Program(
            "bad",
            (Array("A", (8, 8)),),
            (Statement("S0", its, dom, write, reads, body, (0,) * (len(its) + 1)),),
        )

    six = tuple("abcdef")
    with pytest.raises(UnsupportedProgramError, match="6 loop levels"):
        prog(six, " and ".join(f"0 <= {v} < 2" for v in six), Access("A", ("a", "b")))
    with pytest.raises(UnsupportedProgramError, match="not an affine expression|floor/mod"):
        prog(("i", "j"), "0 <= i < 8 and 0 <= j < 8", Access("A", ("i * j", "j")))
    with pytest.raises(UnsupportedProgramError, match="leaves the array's bounds"):
        prog(("i", "j"), "0 <= i < 8 and 0 <= j < 8", Access("A", ("i + 1", "j")))
    with pytest.raises(UnsupportedProgramError, match="unbounded"):
        prog(("i", "j"), "0 <= i and 0 <= j < 8", Access("A", ("i", "j")))
    assert issubclass(UnsupportedProgramError, trl.TimeRLError)


def test_make_and_run(measurer) -> None:
    ctx = trl.Context(dims=("b", "i", "t"))
    rewards = []
    with ctx as ((b, B), (i, I), (t, T)):
        env = trl.env.make(
            "tiramisu.benchmarks",
            num_envs=B,
            split="test",
            episode_len=3,
            programs=[bm.mvt(64), bm.cvtcolor(32, 32)],
            measurer=measurer,
        )
        assert env.obs_space.shape == (OBS_SIZE,) and env.action_space.n == NUM_ACTIONS
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        mask = env.action_mask(o)
        a = (mask * 0.0 + trl.const(np.eye(NUM_ACTIONS, dtype=np.float32)[A["P(0)"]])).argmax(
            -1
        )  # always P(0)
        o[b, i, t + 1], r, d = env.step(a)
        r[b, i, 0:T].sum(0).sink(lambda v, pt: rewards.append(float(v)))
    ctx.compile({B: 2, I: 1, T: d}, backend="torch").execute()
    assert len(rewards) == 2
    assert all(np.isfinite(rewards))
    assert len(env.history) == 2 and {h.program for h in env.history} == {"mvt", "cvtcolor"}
    assert all(h.actions[0] == A["P(0)"] for h in env.history)


def test_unknown_set() -> None:
    with trl.Context(dims=("b", "i", "t")) as ((b, B), _, _):
        with pytest.raises(trl.TimeRLError, match="unknown Tiramisu set"):
            trl.env.make("tiramisu.nope", num_envs=B)

"""Buffer imitation (``--bc-coef``): every PPO update also imitates each program's kept best
episode, replayed from its initial state (``env.demo_buffer``, no measurements)."""

from __future__ import annotations

import numpy as np

import timerl as trl
from timerl.agents.tiramisu import GATPolicy, TiramisuArgs, build, latest_weights, make_env
from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu.actions import ACTIONS, NEXT
from timerl.envs.tiramisu.env import TiramisuTask, _TiramisuState
from timerl.envs.tiramisu.features import flatten, graph
from timerl.envs.tiramisu.measure import Measurer

A = {a.name: k for k, a in enumerate(ACTIONS)}
DEMO = (A["U(4)"], NEXT, A["P(0)"])


class _Constant:
    """A measurer without compiles: every schedule takes 1 s (rewards: 0, or the penalty)."""

    def seconds(self, sched) -> float:
        return 1.0


def _args(tmp_path, bc_coef: float, **kw) -> TiramisuArgs:
    kw = {
        "iterations": 10,
        "episode_len": 3,
        "num_envs": 2,
        "update_epochs": 2,
        "num_minibatches": 2,
        **kw,
    }
    return TiramisuArgs(
        bc_coef=bc_coef,
        sil_coef=0.0,
        surrogate="off",
        mask="legal",
        threads=1,
        checkpoint_every=kw["iterations"],
        checkpoint_dir=str(tmp_path / f"ckpt_{bc_coef}"),
        progress=False,
        **kw,
    )


def _train(args: TiramisuArgs, demo_speedup: float):
    def env_fn(a, B):
        env = make_env(a, B, programs=[bm.mvt(6)], measurer=_Constant())
        env._state.demos["mvt"] = (demo_speedup, DEMO)  # never beaten: the measurer's times are equal
        return env

    ex, env = build(args, lambda v, pt: None, env_fn=env_fn)
    ex.execute()
    return latest_weights(args.checkpoint_dir), env


def _demo_probs(args: TiramisuArgs, weights: dict, obs, mask, acts) -> list[float]:
    """The legal-masked policy's probability of the demonstration's action at each of its states."""
    out: dict[int, np.ndarray] = {}
    ctx = trl.Context(dims=("k",))
    with ctx as ((k, K),):
        dnn = GATPolicy((), args.seed, args.heads, args.hidden, weights, args.arch)
        lp = trl.log_softmax(dnn.forward(trl.const(obs)[k], trl.const(mask)[k]), -1)
        lp.sink(lambda v, pt: out.__setitem__(pt["k"], np.exp(v)))
    ctx.compile({K: len(acts)}, backend="torch").execute()
    return [float(out[j][acts[j]]) for j in range(len(acts))]


def test_the_buffer_replays_each_kept_demonstration_without_measuring() -> None:
    measurer = Measurer(disk_cache=False, threads=1)
    task = TiramisuTask(bm.mvt(6), measurer)
    st = _TiramisuState("tiramisu.test", 2, 0, [task], True, 4, None)
    st.bind({})
    st.demos["mvt"] = (1.5, (A["U(4)"], A["U(4)"], NEXT))  # the second U(4): a no-op (visited)
    obs, mask, acts, w = st.demo_buffer(4, legal=True, min_speedup=1.1)
    assert acts.tolist() == [A["U(4)"], A["U(4)"], NEXT, NEXT]
    assert w.tolist() == [1.0, 0.0, 1.0, 0.0]  # the no-op and the empty slot are not imitated
    s1 = task.try_action(task.initial, 0, A["U(4)"])
    assert np.array_equal(obs[0], flatten(*graph(task.initial, 0)))
    assert np.array_equal(obs[1], flatten(*graph(s1, 0))) and np.array_equal(obs[2], obs[1])
    assert mask[0, A["U(4)"]] == 1.0 and mask[1, A["U(4)"]] == 0.0 and mask[2, NEXT] == 1.0
    assert measurer.compiles == 0
    st.demos["mvt"] = (1.05, st.demos["mvt"][1])  # below min_speedup: nothing to imitate
    assert st.demo_buffer(4, legal=True, min_speedup=1.1)[3].tolist() == [0.0] * 4


def test_bc_raises_the_demonstration_actions_probability(tmp_path) -> None:
    args = _args(tmp_path, 2.0)
    weights, env = _train(args, 100.0)
    obs, mask, acts, w = env._state.demo_buffer(args.episode_len, legal=True, min_speedup=1.1)
    assert w.tolist() == [1.0, 1.0, 1.0]
    p0 = _demo_probs(
        args, GATPolicy.init_weights(args.seed, args.heads, args.hidden, args.arch), obs, mask, acts
    )
    p = _demo_probs(args, weights, obs, mask, acts)
    assert max(p0) < 0.06  # ~uniform over the ~25 legal actions at first
    assert min(p) > 0.2, (p0, p)


def test_bc_off_or_nothing_to_imitate_leaves_the_training_unchanged(tmp_path) -> None:
    args = _args(tmp_path, 0.0, iterations=4)
    off, env_off = _train(args, 100.0)
    # bc on, but the demonstration is below --demo-min-speedup: every slot has weight 0
    empty, env_empty = _train(_args(tmp_path, 1.0, iterations=4), 1.05)
    # the same episodes (the program's random streams are unchanged by the imitation's ops) ...
    assert [r.actions for r in env_off.history] == [r.actions for r in env_empty.history]
    assert off.keys() == empty.keys()
    init = GATPolicy.init_weights(args.seed, args.heads, args.hidden, args.arch)

    def dist(x: dict, y: dict) -> float:
        return float(np.sqrt(sum(((x[n] - y[n]) ** 2).sum() for n in off)))

    # ... and the same updates, up to rounding (Adam scales a rounding difference in a
    # near-zero gradient to a step): far closer than the training moved the weights (that
    # imitating a real demonstration moves them is test_bc_raises_the_demonstration_actions_probability)
    assert dist(off, empty) < 0.02 * dist(off, init), (dist(off, empty), dist(off, init))

"""DQN (Mnih et al., 2015) with Double-DQN targets (van Hasselt et al., 2016) and
proportional prioritised replay (Schaul et al., 2016), in the spirit of APEX-DQN
(Horgan et al., 2018), which LoopTune (papers/looptune.txt) found best for loop
scheduling. One recurrent-tensor program over dims (b, i, t, k); iteration i
  learns   (i, k):    K learner steps on minibatches sampled from the replay buffer,
                      params over (i, k) (Adam steps along k and carries into i + 1),
                      target network w[i - i % C, 0];
  then acts (b, i, t): B actors run one episode each, epsilon-greedy on the learner's
                      Q(., w[i, K - 1]), epsilon annealed over i and spread over the
                      actors as in APEX (actor b: eps ** (1 + alpha * b / (B - 1))).
The replay buffer is a Python object behind UDFs: `push` at every (b, i, t), `sample`
a minibatch and `update` its priorities with the new |TD errors| at every (i, k).
With an env that keeps demonstrations (LoopTune's `demo_buffer`: each training problem's
fastest measured episode, seeded by a search on the analytic model), every learner step
also adds DQfD's large-margin loss on their states over a slot dim s (`--demo-coef`).
The program is generic over the env id: `--env-id looptune.mm` (the default; add
`--measurer analytic` for a quick run without TVM timing) or `--env-id gym.CartPole-v1`.
On LoopTune it trains on `--train-problems` of the train split with PPO's reward
(`log`, noise margin 0.1), then plays the greedy Q-policy on the same test problems as
examples/ppo_looptune.py (`--eval-problems`, chosen with `--seed`) and reports every
schedule measured again by fresh measurers (timerl.envs.looptune.evaluate), as PPO does.

``examples/dqn_looptune.py`` trains it (``DQNArgs`` are its flags); the tests lower
``build`` to its PDG.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

import timerl as trl
from timerl.run import RunArgs, checkpoint_and_compile

log = logging.getLogger("timerl.agents.dqn")


@dataclass
class DQNArgs(RunArgs):
    """DQN's hyperparameters and the run flags (a ``timerl.run.RunArgs``)."""

    env_id: str = "looptune.mm"
    """environment id with its family prefix (e.g. looptune.mm, gym.CartPole-v1)"""
    measurer: str = ""
    """looptune only: how states are timed (e.g. tvm, analytic); empty: the env's default"""
    reward: str = "log"
    """looptune only: step (the paper's), final, best or log (see ppo_looptune.py)"""
    noise: float = 0.1
    """looptune only, reward=log: relative gains below this are timing noise"""
    train_problems: int = 24
    """looptune only: train on this many problems of the train split (0: all)"""
    eval_problems: int = 16
    """looptune only: test problems tuned by the greedy policy after training (0: all 440)"""
    remeasure: int = 3
    """looptune only: report the untuned and tuned schedules as the best of this many fresh measurers"""
    out_dir: str = "runs/dqn_looptune"
    """run directory: metrics.csv, TensorBoard events, learning_curve.png; on LoopTune also
    the checkpoint, results and plots"""
    backend: str = "jax"
    """tensor backend: jax or torch"""
    num_envs: int = 4
    """actors (the batch dim b); each runs one episode per iteration"""
    iterations: int = 150
    """training iterations (the dim i)"""
    learner_steps: int = 128
    """learner steps per iteration (the dim k), one sampled minibatch each"""
    batch_size: int = 64
    """minibatch size of each learner step"""
    buffer_size: int = 50_000
    """replay capacity (transitions)"""
    learning_starts: int = 500
    """transitions in the buffer before learner steps count (earlier ones get zero weight)"""
    lr: float = 2.5e-4
    """Adam learning rate"""
    gamma: float = 0.99
    """discount factor"""
    target_every: int = 4
    """refresh the target network every this many iterations (target = w[i - i % C, 0])"""
    bootstrap_time_limit: bool = True
    """gym envs: bootstrap the target at the env's step limit (a truncation, not a terminal)"""
    double_dqn: bool = True
    """pick the bootstrap action with the online network (Double DQN)"""
    eps_start: float = 1.0
    """epsilon at iteration 0"""
    eps_end: float = 0.05
    """epsilon after annealing"""
    eps_fraction: float = 0.3
    """fraction of the iterations over which epsilon anneals linearly"""
    actor_eps_alpha: float = 1.0
    """APEX per-actor epsilon: actor b uses eps ** (1 + alpha * b / (B - 1)); 0: all equal"""
    per_alpha: float = 0.6
    """priority exponent alpha (0: uniform replay)"""
    per_beta0: float = 0.4
    """importance-sampling exponent at iteration 0, annealed to 1 at the last iteration"""
    hidden: int = 64
    """hidden units per layer (two layers)"""
    demo_coef: float = 1.0
    """envs with demonstrations (``demo_buffer``, e.g. LoopTune; ignored by others; 0: off):
    weight of DQfD's large-margin loss ``max_a [Q(s, a) + margin (a != a_E)] - Q(s, a_E)`` on
    the states and actions a_E of each training problem's best measured episode so far,
    averaged over the buffer's slots and added to every learner step"""
    demo_margin: float = 0.8
    """the margin of that loss: the demonstrated action's Q-value must beat the others' by it"""
    demo_min_speedup: float = 1.15
    """imitate a problem's best episode once it beats the untuned nest by this factor"""
    seed_demos: bool = True
    """looptune, with --demo-coef > 0: before training, demonstrations from measured
    candidates of a search on this CPU's analytic cost model (``seed_demos.search_demos``)"""
    seed: int = 0
    """random seed"""


# -- prioritised replay ---------------------------------------------------------------------


class Minibatch(NamedTuple):
    """A sampled minibatch of ``m`` transitions (leading dim ``m`` on every field)."""

    obs: np.ndarray  # (m, *obs_shape) float32
    act: np.ndarray  # (m,) int64
    rew: np.ndarray  # (m,) float32
    next_obs: np.ndarray  # (m, *obs_shape) float32
    done: np.ndarray  # (m,) float32, 1.0 where the episode ended with this step
    weight: np.ndarray  # (m,) float32 importance-sampling weights, max 1
    index: np.ndarray  # (m,) int64 buffer slots (for update)


class PrioritizedReplay:
    """Proportional prioritised replay (Schaul et al., 2016, §3.3) on a ring buffer.

    A stored transition ``j`` has priority ``p_j`` and is drawn with probability
    ``P(j) = p_j**alpha / sum_k p_k**alpha``. New transitions get the largest priority
    seen so far, so each is replayed at least once soon. Sampling is stratified: the
    total mass is cut into ``m`` equal segments and one transition is drawn from each,
    with prefix sums and a binary search (O(capacity) per minibatch, which is cheap at
    these sizes; a sum-tree would make it O(m log capacity)). Importance-sampling
    weights ``(N P(j))**-beta`` are divided by the largest weight in the minibatch, so
    they are at most 1. (Dividing by the largest possible weight, that of the least
    likely stored transition, shrinks every step once a few transitions have near-zero
    |TD|; on CartPole the weighted loss fell to 1e-4 that way.)
    """

    def __init__(
        self, capacity: int, obs_shape: tuple[int, ...], alpha: float = 0.6, eps: float = 1e-6
    ) -> None:
        self.capacity = int(capacity)
        self.alpha = float(alpha)
        self.eps = float(eps)
        self.obs = np.zeros((capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), np.float32)
        self.act = np.zeros(capacity, np.int64)
        self.rew = np.zeros(capacity, np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.mass = np.zeros(capacity, np.float64)  # p_j ** alpha; 0 for empty slots
        self.max_priority = 1.0
        self.size = 0
        self.pos = 0

    def add(
        self,
        obs: np.ndarray,
        act: np.ndarray,
        rew: np.ndarray,
        next_obs: np.ndarray,
        done: np.ndarray,
        valid: np.ndarray | None = None,
    ) -> int:
        """Store the rows of a batch of transitions where ``valid``; returns how many."""
        keep = np.ones(len(act), bool) if valid is None else np.asarray(valid, bool).reshape(-1)
        n = int(keep.sum())
        if n == 0:
            return 0
        slots = (self.pos + np.arange(n)) % self.capacity
        self.obs[slots] = np.asarray(obs, np.float32)[keep]
        self.next_obs[slots] = np.asarray(next_obs, np.float32)[keep]
        self.act[slots] = np.asarray(act).reshape(-1)[keep]
        self.rew[slots] = np.asarray(rew, np.float32).reshape(-1)[keep]
        self.done[slots] = np.asarray(done, np.float32).reshape(-1)[keep]
        self.mass[slots] = self.max_priority**self.alpha
        self.pos = int((self.pos + n) % self.capacity)
        self.size = min(self.size + n, self.capacity)
        return n

    def sample(self, m: int, beta: float, rng: np.random.Generator) -> Minibatch:
        """``m`` transitions drawn by priority, with importance weights for ``beta``."""
        if self.size == 0:
            raise trl.TimeRLError("PrioritizedReplay.sample: the buffer is empty")
        cum = np.cumsum(self.mass[: self.size])
        total = cum[-1]
        u = (np.arange(m) + rng.random(m)) * (total / m)
        idx = np.minimum(np.searchsorted(cum, u, side="right"), self.size - 1)
        weight = (self.size * self.mass[idx] / total) ** (-beta)
        weight /= weight.max()
        return Minibatch(
            self.obs[idx],
            self.act[idx],
            self.rew[idx],
            self.next_obs[idx],
            self.done[idx],
            weight.astype(np.float32),
            idx.astype(np.int64),
        )

    def update(self, index: np.ndarray, td_abs: np.ndarray) -> None:
        """New priorities ``|td| + eps`` for the slots ``index`` (the last of duplicates wins)."""
        p = np.abs(np.asarray(td_abs, np.float64)).reshape(-1) + self.eps
        self.mass[np.asarray(index).reshape(-1)] = p**self.alpha
        self.max_priority = max(self.max_priority, float(p.max()))

    _STATE = ("obs", "next_obs", "act", "rew", "done", "mass")

    def save(self, path: str) -> None:
        """Write the whole buffer (contents, priorities, ring position) to ``path`` (.npz)."""
        meta = np.array([self.size, self.pos], np.int64)
        arrays = {k: getattr(self, k) for k in self._STATE}
        np.savez(path, meta=meta, max_priority=np.float64(self.max_priority), **arrays)

    def load(self, path: str) -> None:
        """Restore a buffer written by :meth:`save` (same capacity and observation shape)."""
        with np.load(path) as z:
            for k in self._STATE:
                if z[k].shape != getattr(self, k).shape:
                    raise trl.TimeRLError(f"replay state {path!r}: {k} has shape {z[k].shape}")
                setattr(self, k, z[k].copy())
            self.size, self.pos = (int(x) for x in z["meta"])
            self.max_priority = float(z["max_priority"])


class ReplayUDFs:
    """The buffer's UDF bodies; ``sample`` draws with a generator seeded per ``(i, k)``.

    ``push`` stores the transitions of the actors still running; with ``time_limit`` (a
    gymnasium env's step limit: the env reports done there too, but the episode was cut,
    not ended, and the observation does not show the time left) the step at the limit
    is stored as not done, so its target bootstraps. ``end_iteration`` runs after the
    last pushes of iteration ``i``; every ``save_every`` iterations it writes the buffer
    next to the program's checkpoint of that iteration (``<save_dir>/replay_<i>.npz``),
    so ``--resume`` continues exactly.
    """

    def __init__(
        self,
        buffer: PrioritizedReplay,
        batch_size: int,
        learning_starts: int,
        seed: int,
        save_every: int = 0,
        save_dir: str = "",
        time_limit: int | None = None,
    ) -> None:
        self.buffer = buffer
        self.batch_size = batch_size
        self.learning_starts = learning_starts
        self.seed = seed
        self.save_every = save_every
        self.save_dir = save_dir
        self.time_limit = time_limit

    def push(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        obs, act, rew, next_obs, done, alive, token = inputs
        if self.time_limit is not None and point["t"] + 1 >= self.time_limit:
            done = np.zeros_like(done)  # cut by the env's step limit: truncated, not terminal
        self.buffer.add(obs, act, rew, next_obs, done, valid=alive > 0.5)
        return [np.zeros_like(token)]

    def sample(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        beta, _token = inputs
        if self.buffer.size < max(1, self.learning_starts):  # warm-up: a step with zero weights
            return list(self._empty())
        rng = np.random.default_rng([self.seed, point["i"], point["k"]])
        return list(self.buffer.sample(self.batch_size, float(beta), rng))

    def _empty(self) -> Minibatch:
        m, buf = self.batch_size, self.buffer
        obs = np.zeros((m, *buf.obs.shape[1:]), np.float32)
        z = np.zeros(m, np.float32)
        return Minibatch(obs, np.zeros(m, np.int64), z, obs, z, z, np.zeros(m, np.int64))

    def update(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        index, td_abs = inputs
        if self.buffer.size >= max(1, self.learning_starts):
            self.buffer.update(index, td_abs)
        return [np.zeros((), np.float32)]

    def end_iteration(self, inputs: list[np.ndarray], point: dict[str, int]) -> list[np.ndarray]:
        it = point["i"]
        if self.save_every > 0 and (it + 1) % self.save_every == 0:
            os.makedirs(self.save_dir, exist_ok=True)
            self.buffer.save(os.path.join(self.save_dir, f"replay_{it}.npz"))
        return [np.zeros((), np.float32)]


def _resume_replay(buffer: PrioritizedReplay, resume: str) -> None:
    """Load the buffer saved with the checkpoint that ``resume`` names (if it was saved)."""
    from timerl.runtime.checkpoint import pick_checkpoint

    ckpt = pick_checkpoint(resume)
    with open(ckpt) as f:
        it = int(json.load(f)["iteration"])
    path = os.path.join(os.path.dirname(ckpt), f"replay_{it}.npz")
    if os.path.isfile(path):
        buffer.load(path)
    else:
        log.warning("resume: no replay buffer %s; continuing with an empty buffer", path)


# -- the program ------------------------------------------------------------------------------


def looptune_problems(args: DQNArgs) -> tuple[list, list]:
    """(train, test) problems as examples/ppo_looptune.py picks them for the same seed."""
    from timerl.envs.looptune import dataset

    def subset(problems: list, n: int, seed: int) -> list:
        if n <= 0 or n >= len(problems):
            return list(problems)
        idx = np.random.default_rng(seed).choice(len(problems), n, replace=False)
        return [problems[int(j)] for j in sorted(idx)]

    train, test = dataset.split(args.env_id.split(".", 1)[1], seed=0)
    return subset(train, args.train_problems, args.seed), subset(test, args.eval_problems, args.seed + 1)


def make_env(args: DQNArgs, B: Any) -> Any:
    kwargs: dict[str, Any] = {}
    if args.env_id.startswith("looptune."):
        kwargs["reward"] = args.reward
        kwargs["noise"] = args.noise
        kwargs["problems"] = looptune_problems(args)[0]
        if args.measurer:
            kwargs["measurer"] = args.measurer
    env = trl.env.make(args.env_id, num_envs=B, seed=args.seed, **kwargs)
    if args.env_id.startswith("looptune.") and args.seed_demos and args.demo_coef > 0:
        from timerl.envs.looptune.ppo_run import seed_env_demos

        log.info(seed_env_demos(env, kwargs["problems"]))
    return env


def _time_limit(env_id: str) -> int | None:
    """A gymnasium env's step limit: an episode cut there is truncated, not terminated."""
    if not env_id.startswith("gym."):
        return None
    import gymnasium as gym

    return gym.spec(env_id.removeprefix("gym.")).max_episode_steps


def _one_hot(a: trl.RecurrentTensor, n: int) -> trl.RecurrentTensor:
    return (a.unsqueeze(-1) == trl.const(np.arange(n, dtype=np.int64))).cast(trl.float32)


def margin_loss(
    q: trl.RecurrentTensor, act: trl.RecurrentTensor, weight: trl.RecurrentTensor, n_act: int, margin: float
) -> trl.RecurrentTensor:
    """DQfD's supervised large-margin loss (Hester et al., 2018, eq. 2) per point:
    ``max_a [Q(s, a) + margin * (a != a_E)] - Q(s, a_E)``, times the slot's weight (0 on
    an empty slot); zero once the demonstrated action a_E leads every other by ``margin``."""
    hot = _one_hot(act, n_act)
    return ((q + margin * (1.0 - hot)).max(-1) - (q * hot).sum(-1)) * weight


def build(
    args: DQNArgs, log_fn: Any, replay: ReplayUDFs | None = None, final_params: dict[str, Any] | None = None
) -> Any:
    """The whole DQN program; ``log_fn(v, point)`` gets ``(return, steps)`` per ``(b, i)``
    and ``(mean loss, epsilon)`` per ``i`` (a point without ``b``); ``final_params``, if
    given, receives the actors' Q-network parameters (``dnn.w0``, ...) of every iteration."""
    import gymnasium as gym

    # s: the demonstration buffer's slots (one context dim more; unused without demonstrations)
    ctx = trl.Context(dims=("b", "i", "t", "k", "s"))
    with ctx as ((b, B), (i, I), (t, T), (k, K), (s, S)):
        env = make_env(args, B)
        demo = args.demo_coef > 0.0 and hasattr(env, "demo_buffer")
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise trl.TimeRLError(f"DQN needs a Discrete action space, got {env.action_space}")
        n_act = int(env.action_space.n)
        obs_shape = tuple(int(s) for s in env.obs_space.shape)
        if replay is None:
            buffer = PrioritizedReplay(args.buffer_size, obs_shape, alpha=args.per_alpha)
            if args.resume:
                _resume_replay(buffer, args.resume)
            replay = ReplayUDFs(
                buffer,
                args.batch_size,
                args.learning_starts,
                args.seed,
                args.checkpoint_every,
                args.checkpoint_dir,
                _time_limit(args.env_id) if args.bootstrap_time_limit else None,
            )
        # Q-network: the categorical head's logits are the Q-values; params over (i, k),
        # Adam steps along k and carries w[i + 1, 0] = update at (i, K - 1).
        dnn = (
            trl.DNNBuilder(domain=(i, k), seed=args.seed)
            .from_env(env, hidden=[args.hidden] * 2, activation="relu")
            .build()
        )
        # Iteration i first learns (K steps on what iterations < i stored), then acts.
        # The actors use the params after learner step K - 1 (the last step's result
        # reaches them one iteration later, as with APEX's periodically synced actors).
        actor = dnn.at(i, K - 1)
        target = dnn.at(i - i % args.target_every, 0)

        # Order tokens make the buffer's effects run in program order: sample (i, 0) after
        # end_iteration (i - 1), which follows the last pushes of iteration i - 1; sample
        # (i, k + 1) after update (i, k); an actor's push at t after its push at t - 1 and,
        # at t = 0, after update (i, K - 1).
        before = trl.empty((), domain=(i, k), name="sample_after")
        after = trl.empty((), domain=(b, i, t), name="push_after")

        # Learning: sample a prioritised minibatch, Double-DQN TD error, Huber loss
        # weighted by the importance weights, Adam; new priorities |td|.
        beta = args.per_beta0 + (1.0 - args.per_beta0) * trl.as_tensor(i) / float(max(1, args.iterations - 1))
        m = args.batch_size
        mb = trl.udf(
            replay.sample,
            [
                ((m, *obs_shape), trl.float32),
                ((m,), trl.int64),
                ((m,), trl.float32),
                ((m, *obs_shape), trl.float32),
                ((m,), trl.float32),
                ((m,), trl.float32),
                ((m,), trl.int64),
            ],
            domain=(i, k),
            inputs=[beta, before],
            name="replay.sample",
        )
        s_obs, s_act, s_rew, s_next, s_done, s_weight, s_index = mb
        q = (dnn.forward(s_obs) * _one_hot(s_act, n_act)).sum(-1)
        q_next = target.forward(s_next)
        a_next = (dnn.forward(s_next) if args.double_dqn else q_next).argmax(-1)
        v_next = (q_next * _one_hot(a_next, n_act)).sum(-1)
        y = (s_rew + args.gamma * (1.0 - s_done) * v_next).detach()
        td = q - y
        abs_td = td.abs()
        huber = trl.where(abs_td < 1.0, 0.5 * td * td, abs_td - 0.5)
        loss = (s_weight * huber).mean()
        loss.backward()
        if demo:  # DQfD's large-margin loss on the demonstrations, at every learner step
            o_d, a_d, w_d = env.demo_buffer(
                (i, s), s, S, min_speedup=args.demo_min_speedup, after=[before[i, 0]]
            )
            j_e = margin_loss(dnn.forward(o_d), a_d, w_d, n_act, args.demo_margin)
            (j_e * (args.demo_coef / float(env.demo_slots()))).backward()
        trl.optim.Adam(dnn.params, lr=args.lr).step()
        (updated,) = trl.udf(
            replay.update,
            [((), trl.float32)],
            domain=(i, k),
            inputs=[s_index, abs_td.detach()],
            name="replay.update",
        )

        # Acting: epsilon-greedy, epsilon annealed linearly over i, then per actor (APEX).
        frac = trl.as_tensor(i) / float(max(1, int(args.eps_fraction * args.iterations)))
        eps_i = trl.where(frac < 1.0, args.eps_start + (args.eps_end - args.eps_start) * frac, args.eps_end)
        if args.actor_eps_alpha > 0:
            expo = 1.0 + args.actor_eps_alpha * trl.as_tensor(b) / float(max(1, args.num_envs - 1))
            eps = eps_i**expo
        else:
            eps = eps_i
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        greedy = actor.forward(o).argmax(-1)
        u = trl.rand((2,), domain=(b, i, t))  # u[0]: explore?  u[1]: which random action
        a = trl.where(u[b, i, t, 0] < eps, (u[b, i, t, 1] * float(n_act)).cast(trl.int64), greedy)
        o_next, r, d = env.step(a)
        o[b, i, t + 1] = o_next
        # alive[t]: the actor's episode had not ended before t (finished envs keep stepping)
        alive = trl.empty((), domain=(b, i, t), name="alive")
        alive[b, i, 0] = trl.ones(())
        alive[b, i, t + 1] = 1.0 - d.cast(trl.float32)
        (pushed,) = trl.udf(
            replay.push,
            [((), trl.float32)],
            domain=(b, i, t),
            inputs=[o, a, r, o_next, d.cast(trl.float32), alive, after],
            name="replay.push",
            batch_dims=(b,),
        )
        (ended,) = trl.udf(
            replay.end_iteration,
            [((), trl.float32)],
            domain=(i,),
            inputs=[pushed[0:B, i, T - 1].sum()],
            name="replay.end_iteration",
        )
        before[0, 0] = trl.zeros(())
        before[i + 1, 0] = ended
        before[i, k + 1] = updated
        after[b, i, 0] = updated[i, K - 1]
        after[b, i, t + 1] = pushed

        # Reporting: per actor (episode return, steps alive); per iteration (mean loss, epsilon).
        trl.stack([r[b, i, 0:T].sum(0), alive[b, i, 0:T].sum(0)]).sink(log_fn)
        trl.stack([loss[i, 0:K].mean(), eps_i]).sink(log_fn)
        if final_params is not None:  # the actors' Q-network of each iteration (the last one stays)
            for n, (w, bias) in enumerate(actor.layers):
                w.sink(lambda v, pt, key=f"dnn.w{n}": final_params.__setitem__(key, v))
                bias.sink(lambda v, pt, key=f"dnn.b{n}": final_params.__setitem__(key, v))
    bounds = {B: args.num_envs, I: args.iterations, T: d, K: args.learner_steps}
    if demo:
        bounds[S] = env.demo_slots()
    return checkpoint_and_compile(ctx, args, dnn, i, bounds)

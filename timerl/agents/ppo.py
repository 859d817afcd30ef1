"""PPO (Schulman et al., 2017) with GAE as one recurrent-tensor program over dims (b, i, t).

The TimeRL setting: one epoch, one minibatch (the whole rollout of iteration i), so the
policy's activations from acting are reused by the symbolic autodiff for learning.
With ``update_epochs`` E / ``num_minibatches`` M the updates are two more dims (e, m): the
parameters vary over (i, e, m), acting uses those at (i, 0, 0), and every (e, m) runs a
new forward pass: with ``num_steps`` over minibatch m of the rollout shuffled per epoch
(CleanRL's minibatches, taken as rows), episodic over the steps t with t % M == m.

Public API (``examples/ppo.py`` is the training script around it)::

    from timerl.agents import ppo
    args = ppo.PPOArgs(env_id="CartPole-v1", num_envs=8, num_steps=128)
    ex = ppo.build_fixed(args, log_fn)     # num_steps > 0: fixed-length rollouts
    ex = ppo.build(args, log_fn)           # num_steps == 0: one episode per env and iteration
    ex.execute()

``log_fn(value, point)`` is a sink called once per env and iteration (:func:`build`) or
once per iteration (:func:`build_fixed`). With ``num_seeds`` / ``sweep`` (several agents,
either build) the agents run along a last dim ``s`` (``point["s"]``): agent k as the
one-agent run with ``seed + k`` and its settings. The pieces (:func:`gae`, :func:`normalise`,
:func:`clipped_loss`, :func:`surrogate`, :func:`minibatch_loss`) serve agents with their own
network or env (``examples/ppo_tiramisu.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

import timerl as trl
from timerl.errors import TimeRLError
from timerl.run import RunArgs, checkpoint_and_compile

if TYPE_CHECKING:
    from timerl.compile import Executor
    from timerl.rt.tensor import RecurrentTensor as RT
    from timerl.symbolic import Sym

LogFn = Callable[[np.ndarray, dict[str, int]], None]
"""A sink: ``log_fn(host_value, point)``, ``point`` maps dim names to their values."""
EnvFn = Callable[[Any, Any], Any]
"""``env_fn(args, B)``: the env of ``args`` with ``B`` (a bound symbol) envs along dim b;
``env_fn(args, B, S)`` with several agents (``B`` envs per agent, S the agent dim's bound)."""


@dataclass
class PPOArgs(RunArgs):
    """PPO's hyperparameters and the run flags (``RunArgs``); every field is a flag of
    ``examples/ppo.py`` (and of the agents that subclass it), its docstring the ``--help`` line."""

    env_id: str = "CartPole-v1"
    """the environment: a gymnasium id, brax.<name>, gymnax.<id> or looptune.<dataset>"""
    backend: str = "jax"
    """tensor backend: jax or torch"""
    num_envs: int = 4
    """parallel environments (the batch dim b)"""
    iterations: int = 250
    """training iterations (the dim i); each runs one episode per env (or --num-steps steps)"""
    num_steps: int = 0
    """steps per rollout: 0 runs one episode per env and iteration (T dynamic: the longest
    episode); N > 0 runs N steps (T = N static) with envs reset as they finish and
    iteration i continuing where i - 1 stopped (CleanRL's rollouts)"""
    lr: float = 3e-3
    """Adam learning rate (annealed linearly to 0 over the iterations)"""
    anneal_lr: bool = True
    """anneal the learning rate (an RT over i)"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    clip_coef: float = 0.2
    """surrogate clipping coefficient"""
    ent_coef: float = 0.0
    """entropy bonus coefficient"""
    vf_coef: float = 0.5
    """value-loss coefficient"""
    max_grad_norm: float = 0.0
    """clip the gradients' global norm to this before each Adam step (0: off; CleanRL: 0.5)"""
    adam_eps: float = 1e-8
    """Adam's epsilon (CleanRL: 1e-5)"""
    norm_adv: bool = True
    """normalise advantages over the rollout of each iteration"""
    hidden: int = 64
    """hidden units per layer"""
    layers: int = 2
    """hidden layers of the actor and of the critic"""
    shared: bool = False
    """share the actor and critic trunk"""
    update_epochs: int = 1
    """epochs over each rollout (a dim e); > 1 recomputes the forward pass"""
    num_minibatches: int = 1
    """minibatches per epoch (a dim m). With --num-steps: the rollout's B x N samples shuffled
    each epoch and cut into M minibatches (CleanRL); episodic: minibatch m holds the steps
    t with t % M == m"""
    clip_vloss: bool = True
    """with epochs/minibatches and --num-steps: clip the value loss around the rollout's
    values by --clip-coef (CleanRL); a no-op for one epoch and one minibatch"""
    update_dims: bool = False
    """build the (i, e, m) program even for one epoch and one minibatch (a check of it)"""
    bc_coef: float = 0.0
    """buffer imitation (0: off; envs with ``demo_buffer``, e.g. LoopTune): weight of the
    cross-entropy ``-log pi(a|s)`` on the states and actions of each task's best measured
    training episode so far (those reaching --demo-min-speedup), replayed without
    measurements and added to every update (summed over the demonstrations' steps, divided
    by --num-envs like the PPO loss); spends no env episodes"""
    demo_min_speedup: float = 1.1
    """with --bc-coef > 0: imitate a task's best episode only once it reaches this speedup"""
    out_dir: str = "runs/ppo"
    """run directory: metrics.csv, TensorBoard events, learning_curve.png"""
    seed: int = 0
    """random seed"""
    num_seeds: int = 1
    """agents trained at once in one program, along a dim s: agent k runs as a one-agent run
    with --seed SEED + k would (its network, its envs, its random draws); episodic, T is the
    longest episode of every agent's envs"""
    sweep: tuple[str, ...] = ()
    """settings varied over the agents, a grid: --sweep lr=3e-4,1e-3 ent_coef=0,0.01 trains
    every combination, each with --num-seeds seeds (fields: lr, ent_coef, vf_coef, clip_coef,
    gamma, gae_lambda)"""


SWEEPABLE = ("lr", "ent_coef", "vf_coef", "clip_coef", "gamma", "gae_lambda")
"""The settings ``--sweep`` may vary over the agents (each used as an RT over the agent dim)."""


def agent_settings(args: PPOArgs) -> list[dict[str, float]]:
    """One dict per agent: ``--sweep``'s grid (settings among :data:`SWEEPABLE`), each with
    ``--num-seeds`` seeds; agent ``k`` has ``seed = --seed + k`` (``trl.run.agent_settings``)."""
    return trl.run.agent_settings(args.sweep, args.num_seeds, args.seed, SWEEPABLE)


def check_args(args: PPOArgs) -> None:
    """Raise a ``TimeRLError`` naming the flag when ``args`` cannot make a PPO program (before
    anything is built: a bad flag is reported before the env starts or the program compiles)."""
    for name in ("num_envs", "iterations", "update_epochs", "num_minibatches", "hidden"):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise TimeRLError(f"{flag} must be at least 1, got {getattr(args, name)}")
    if args.num_steps < 0:
        raise TimeRLError(
            f"--num-steps must be 0 (one episode per env) or a step count, got {args.num_steps}"
        )
    if args.layers < 0:
        raise TimeRLError(f"--layers must be 0 or more, got {args.layers}")
    if len(agent_settings(args)) > 1 and args.bc_coef > 0.0:
        raise TimeRLError(
            "--bc-coef imitates one agent's demonstrations: with --num-seeds / --sweep (several "
            "agents) give --bc-coef 0, or train one agent per run"
        )
    n = args.num_envs * args.num_steps
    if args.num_steps > 0 and n % args.num_minibatches:
        raise TimeRLError(
            f"--num-minibatches {args.num_minibatches} must divide --num-envs x --num-steps = "
            f"{args.num_envs} x {args.num_steps} = {n}"
        )


def gae(
    args: PPOArgs,
    b: Sym,
    i: Sym,
    t: Sym,
    T: Sym,
    v: RT,
    r: RT,
    d: RT,
    agents: tuple[Sym, ...] = (),
) -> tuple[RT, RT, RT]:
    """alive mask (the env had not finished before t), GAE advantages as a backward
    recurrence over t (dynamic T), and returns. ``agents``: the agent dim (last in the
    context: indices leave it implicit; T is then the longest episode of every agent's envs,
    the steps after an env's end masked by ``alive``)."""
    alive = trl.empty((), domain=(b, i, t, *agents), name="alive")
    alive[b, i, 0] = trl.ones(())
    alive[b, i, t + 1] = 1.0 - d.cast(trl.float32)
    not_done = 1.0 - d.cast(trl.float32)
    v_next = trl.empty((), domain=(b, i, t, *agents), name="v_next")
    v_next[b, i, T - 1] = trl.zeros(())
    v_next[b, i, t] = v[b, i, t + 1]
    delta = (r + args.gamma * not_done * v_next.detach() - v.detach()) * alive
    adv = trl.empty((), domain=(b, i, t, *agents), name="adv")
    adv[b, i, T - 1] = delta[b, i, T - 1]
    adv[b, i, t] = delta + args.gamma * args.gae_lambda * not_done * adv[b, i, t + 1]
    ret = adv + v.detach()
    return alive, adv, ret


def normalise(args: PPOArgs, adv: RT, alive: RT, B: Sym, i: Sym, T: Sym) -> RT:
    """(adv - mean) / std over every alive step of iteration i's rollout (per agent with an
    agent dim: it stays implicit in the slices)."""
    if not args.norm_adv:
        return adv
    n = alive[0:B, i, 0:T].sum()
    mu = (adv[0:B, i, 0:T] * alive[0:B, i, 0:T]).sum() / n
    dev = (adv[0:B, i, 0:T] - mu) * alive[0:B, i, 0:T]
    std = ((dev * dev).sum() / n).sqrt()
    return (adv - mu) / (std + 1e-8)


def _clip(x: RT, lo: Any, hi: Any) -> RT:
    """``x`` clipped to ``[lo, hi]`` (floats, or RTs: a clip coefficient per agent)."""

    def rt(v: Any) -> RT:
        return v if isinstance(v, trl.RecurrentTensor) else trl.full((), v)

    return trl.where(x < lo, rt(lo), trl.where(x > hi, rt(hi), x))


def surrogate(args: PPOArgs, logp: RT, logp_old: RT, adv_n: RT) -> RT:
    """Per-point clipped surrogate loss ``max(-A r, -A clip(r, 1 - c, 1 + c))``."""
    ratio = (logp - logp_old.detach()).exp()
    pg1 = -adv_n * ratio
    pg2 = -adv_n * _clip(ratio, 1.0 - args.clip_coef, 1.0 + args.clip_coef)
    return trl.where(pg1 > pg2, pg1, pg2)


def clipped_loss(args: PPOArgs, logp: RT, logp_old: RT, entropy: RT, v: RT, ret: RT, adv_n: RT) -> RT:
    """Per-point PPO loss: clipped surrogate + value loss - entropy bonus."""
    v_loss = 0.5 * (v - ret) * (v - ret)
    return surrogate(args, logp, logp_old, adv_n) + args.vf_coef * v_loss - args.ent_coef * entropy


def make_env(args: PPOArgs, B: Sym, S: Sym | None = None) -> Any:
    """``args.env_id`` with a family prefix (``brax.…``, ``looptune.…``) as is, else gymnasium;
    ``S``: the agent dim's bound (``B`` envs per agent, agent k's seeded with seed + k)."""
    env_id = (
        args.env_id
        if args.env_id.split(".")[0] in ("gym", "brax", "gymnax", "looptune")
        else f"gym.{args.env_id}"
    )
    extra: dict[str, Any] = {"autoreset": True} if args.num_steps > 0 else {}
    if S is not None:
        extra["agents"] = S
    return trl.env.make(env_id, num_envs=B, seed=args.seed, **extra)


def gae_fixed(
    args: PPOArgs,
    b: Sym,
    i: Sym,
    t: Sym,
    T: Sym,
    v: RT,
    v_last: RT,
    r: RT,
    d: RT,
    agents: tuple[Sym, ...] = (),
) -> tuple[RT, RT]:
    """GAE over a fixed-length rollout: ``d[t]`` ends an episode at step t (the env reset
    inside that step), ``v_last`` bootstraps from the observation after the last step.
    ``agents``: the agent dim (last in the context: indices leave it implicit)."""
    not_done = 1.0 - d.cast(trl.float32)
    v_next = trl.empty((), domain=(b, i, t, *agents), name="v_next")
    v_next[b, i, T - 1] = v_last
    v_next[b, i, t] = v[b, i, t + 1]
    delta = r + args.gamma * not_done * v_next.detach() - v.detach()
    adv = trl.empty((), domain=(b, i, t, *agents), name="adv")
    adv[b, i, T - 1] = delta[b, i, T - 1]
    adv[b, i, t] = delta + args.gamma * args.gae_lambda * not_done * adv[b, i, t + 1]
    return adv, adv + v.detach()


def normalise_fixed(args: PPOArgs, adv: RT, B: Sym, i: Sym, T: Sym) -> RT:
    """(adv - mean) / std over iteration i's whole rollout (the one minibatch); the sample
    standard deviation (n - 1), as the minibatch path and CleanRL's ``Tensor.std()``."""
    if not args.norm_adv:
        return adv
    n = float(args.num_envs * args.num_steps)
    mu = adv[0:B, i, 0:T].sum() / n
    dev = adv[0:B, i, 0:T] - mu
    std = ((dev * dev).sum() / max(n - 1.0, 1.0)).sqrt()
    return (adv - mu) / (std + 1e-8)


def minibatch_loss(
    args: PPOArgs,
    dnn: Any,
    B: Sym,
    T: Sym,
    i: Sym,
    e: Sym,
    m: Sym,
    o: RT,
    a: RT,
    logp_old: RT,
    v_old: RT,
    adv: RT,
    ret: RT,
    agents: tuple[Sym, ...] = (),
) -> tuple[RT, RT]:
    """PPO's loss on minibatch m of epoch e, as CleanRL computes it: iteration i's rollout
    flattened to ``B * T`` samples, shuffled once per epoch (``argsort`` of uniform keys),
    minibatch m the samples at ranks ``m * mb .. (m + 1) * mb``, taken as rows; advantages
    normalised over the minibatch; the value loss clipped around the rollout's values
    (``--clip-vloss``). One forward pass over ``mb`` samples per update, not over the rollout.
    Returns the loss and the minibatch's sample indices (into the rollout flattened b-major)."""
    n = args.num_envs * args.num_steps
    if n % args.num_minibatches:
        raise TimeRLError(f"--num-minibatches {args.num_minibatches} must divide num_envs x num_steps = {n}")
    mb = n // args.num_minibatches

    def rows(x):  # iteration i's rollout of x as B * T rows
        flat = x.detach()[0:B, i, 0:T]
        return flat.reshape(-1, *flat.shape[2:])

    perm = trl.rand((n,), domain=(i, e, *agents), name="shuffle").argsort()  # one shuffle per agent
    idx = perm.reshape(args.num_minibatches, mb)[(i, e, *agents, m)]
    logp, ent, v_new = dnn.evaluate(rows(o).take(idx), rows(a).take(idx))
    adv_mb, ret_mb, v_mb = rows(adv).take(idx), rows(ret).take(idx), rows(v_old).take(idx)
    if args.norm_adv:
        dev = adv_mb - adv_mb.mean()
        adv_mb = dev / (((dev * dev).sum() / float(max(mb - 1, 1))).sqrt() + 1e-8)
    pg_loss = surrogate(args, logp, rows(logp_old).take(idx), adv_mb).mean()
    v_loss = (v_new - ret_mb) * (v_new - ret_mb)
    if args.clip_vloss:
        dv = _clip(v_new - v_mb, -args.clip_coef, args.clip_coef)
        v_clip = (v_mb + dv - ret_mb) * (v_mb + dv - ret_mb)
        v_loss = trl.where(v_clip > v_loss, v_clip, v_loss)
    return pg_loss + args.vf_coef * 0.5 * v_loss.mean() - args.ent_coef * ent.mean(), idx


def sil_loss(logp: RT, ret: RT, v: RT, vf: float) -> RT:
    """Self-imitation's per-point loss (Oh et al. 2018): ``-logp * max(ret - v, 0)`` (the
    clipped advantage held constant) ``+ vf / 2 * max(ret - v, 0)^2``: raises the
    probability of a replayed action and the value where the replayed return beats the
    value estimate, and does nothing where it does not."""
    gap = (ret - v).relu()
    return -logp * gap.detach() + 0.5 * vf * gap * gap


def bc_loss(logp: RT, weight: RT) -> RT:
    """Buffer imitation's per-point loss: the cross-entropy ``-logp`` of a demonstration's
    action, times the slot's weight (0 on an empty slot)."""
    return -logp * weight


def _network(
    args: PPOArgs,
    env: Any,
    pdims: tuple[Sym, ...],
    weights: dict[str, np.ndarray] | None,
    agents: tuple[Sym, ...] = (),
    seeds: list[int] | None = None,
) -> Any:
    """The actor-critic over the parameter dims ``pdims`` (``(i,)`` or ``(i, e, m)``, and the
    agent dim: one network per seed of ``seeds``)."""
    return (
        trl.DNNBuilder(domain=pdims + agents, seed=args.seed, seeds=seeds if agents else None, agents=agents)
        .from_env(env, hidden=[args.hidden] * args.layers, critic=True, shared=args.shared)
        .build(weights)
    )


def _adam_step(args: PPOArgs, i: Sym, dnn: Any) -> None:
    """Adam on every parameter, the learning rate annealed linearly over ``i`` (``--anneal-lr``)."""
    lr: Any = args.lr
    if args.anneal_lr:
        lr = args.lr * (1.0 - trl.as_tensor(i) / float(args.iterations))
    trl.optim.Adam(dnn.params, lr=lr, eps=args.adam_eps, max_grad_norm=args.max_grad_norm or None).step()


def build_fixed(
    args: PPOArgs,
    log_fn: LogFn,
    env_fn: EnvFn = make_env,
    weights: dict[str, np.ndarray] | None = None,
    **options: Any,
) -> Executor:
    """PPO over fixed-length rollouts (``--num-steps N``): T = N static, envs auto-reset,
    done masks in GAE, bootstrap from V of the observation after step N - 1; the observation
    of iteration i's first step is the one after i - 1's last step. ``log_fn`` gets, per env
    iteration, the rewards and done flags of the rollout of every env (shape ``(2, B, N)``); ``options``
    go to ``ctx.compile`` (e.g. ``vectorize_time=False``)."""
    check_args(args)
    epochs = args.update_epochs > 1 or args.num_minibatches > 1 or args.update_dims
    settings = agent_settings(args)
    many = len(settings) > 1  # agents along a dim s, last: indices leave it implicit
    dims = ("b", "i", "e", "m", "t") if epochs else ("b", "i", "t")
    ctx = trl.Context(dims=dims + ("s",) if many else dims)
    with ctx as syms:
        (b, B), (i, I), (t, T) = syms[0], syms[1], syms[len(dims) - 1]
        upd = list(syms[2 : len(dims) - 1])
        ag: tuple[Sym, ...] = (syms[-1][0],) if many else ()
        hp = trl.run.per_agent(args, settings, ag[0]) if many else args  # settings per agent: RTs over s
        env = env_fn(args, B, syms[-1][1]) if many else env_fn(args, B)
        pdims = (i, *(s for s, _ in upd))
        dnn = _network(args, env, pdims, weights, ag, [int(st["seed"]) for st in settings])
        actor = dnn.at(i, 0, 0) if epochs else dnn
        o = trl.like(env.obs_space, domain=(b, i, t, *ag), name="obs")
        o0 = env.reset(domain=(b, *ag))
        a = actor(o)
        v = actor.value()
        logp_old = actor.log_prob(a)
        ent_old = actor.entropy()
        o_next, r, d = env.step(a)
        o[b, 0, 0] = o0
        o[b, i, 0] = o_next[b, i - 1, T - 1]
        o[b, i, t + 1] = o_next
        v_last = actor.value(o_next[b, i, T - 1])
        adv, ret = gae_fixed(hp, b, i, t, T, v, v_last, r, d, ag)
        if not epochs:
            adv_n = normalise_fixed(hp, adv, B, i, T)
            per_point = clipped_loss(hp, logp_old, logp_old, ent_old, v, ret, adv_n)
            (per_point * (1.0 / float(args.num_envs * args.num_steps))).backward()
        else:
            (e, _), (m, _) = upd
            loss, _ = minibatch_loss(hp, dnn, B, T, i, e, m, o, a, logp_old, v, adv, ret, ag)
            loss.backward()
        _adam_step(hp, i, dnn)
        trl.stack([r[0:B, i, 0:T], d[0:B, i, 0:T].cast(trl.float32)]).sink(log_fn)
    bounds = {B: args.num_envs, I: args.iterations, T: args.num_steps}
    if epochs:
        bounds.update({upd[0][1]: args.update_epochs, upd[1][1]: args.num_minibatches})
    if many:
        bounds[syms[-1][1]] = len(settings)
    return checkpoint_and_compile(ctx, args, dnn, i, bounds, **options)


def build(
    args: PPOArgs,
    log_fn: LogFn,
    env_fn: EnvFn = make_env,
    weights: dict[str, np.ndarray] | None = None,
    **options: Any,
) -> Executor:
    """The PPO program, compiled; ``env_fn(args, B)`` makes the env (``env_fn(args, B, S)``
    with ``--num-seeds`` / ``--sweep``: ``B`` envs per agent, S agents along a dim s),
    ``weights`` starts the network from given values (e.g. a checkpoint's); ``options`` go
    to ``ctx.compile``. With many agents, T is each iteration's longest episode over every
    agent's envs; ``log_fn``'s point then has the agent ``s``."""
    check_args(args)
    epochs = args.update_epochs > 1 or args.num_minibatches > 1 or args.update_dims
    bc = args.bc_coef > 0.0
    settings = agent_settings(args)
    many = len(settings) > 1  # agents along a dim s, last: indices leave it implicit
    # Dim order is loop order where isl has a choice: the update dims come before t, so
    # one (e, m) update sweeps the rollout over t. k: the imitation buffer's slots.
    dims = ("b", "i", "e", "m", "t") if epochs else ("b", "i", "t")
    ctx = trl.Context(dims=dims + (("k",) if bc else ()) + (("s",) if many else ()))
    with ctx as syms:
        (b, B), (i, I) = syms[:2]
        upd, (t, T) = list(syms[2 : len(dims) - 1]), syms[len(dims) - 1]
        slot = syms[len(dims) : len(dims) + 1] if bc else []
        ag: tuple[Sym, ...] = (syms[-1][0],) if many else ()
        hp = trl.run.per_agent(args, settings, ag[0]) if many else args  # settings per agent: RTs over s
        env = env_fn(args, B, syms[-1][1]) if many else env_fn(args, B)
        if bc and not hasattr(env, "demo_buffer"):
            raise TimeRLError(
                f"--bc-coef needs an env with demonstrations (demo_buffer); {args.env_id} has none"
            )
        pdims = (i, *(s for s, _ in upd))
        dnn = _network(args, env, pdims, weights, ag, [int(st["seed"]) for st in settings])
        actor = dnn.at(i, 0, 0) if epochs else dnn
        # Acting.
        o = trl.like(env.obs_space, domain=(b, i, t, *ag), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i, *ag))
        a = actor(o)
        v = actor.value()  # V(o[t]) from the same forward pass
        o[b, i, t + 1], r, d = env.step(a)
        alive, adv, ret = gae(hp, b, i, t, T, v, r, d, ag)
        adv_n = normalise(hp, adv, alive, B, i, T)
        logp_old = actor.log_prob(a)
        if not epochs:
            # One update: the acting forward pass is the one differentiated (ratio = 1,
            # its gradient is grad log pi).
            per_point = clipped_loss(hp, logp_old, logp_old, actor.entropy(), v, ret, adv_n)
        else:
            m = upd[1][0]
            logp, ent, v_new = dnn.evaluate(o, a)  # parameters at (i, e, m)
            step_mb = trl.as_tensor(t % args.num_minibatches, domain=(i,))  # per i: T is per episode
            in_mb = (step_mb == trl.as_tensor(m)).cast(trl.float32)
            per_point = clipped_loss(hp, logp, logp_old, ent, v_new, ret, adv_n) * in_mb
        loss = per_point * alive / float(args.num_envs)
        loss.backward()
        if bc:  # every update also imitates each task's best episode, from the buffer
            k, K = slot[0]
            part = upd[1][0] if epochs else None  # minibatch m imitates the tasks p % M == m
            o_d, a_d, w_d = env.demo_buffer(
                (i, part, k) if epochs else (i, k),
                k,
                K,
                min_speedup=args.demo_min_speedup,
                after=[r[0:B, i, 0:T].sum()],  # after iteration i's episodes (they may add one)
                part=part,
                parts=args.num_minibatches,
            )
            logp_d, _, _ = dnn.evaluate(o_d, a_d)
            (bc_loss(logp_d, w_d) * (args.bc_coef / float(args.num_envs))).backward()
        _adam_step(hp, i, dnn)
        # per env (and agent): (episode return, steps alive), reported once per iteration
        trl.stack([r[b, i, 0:T].sum(0), alive[b, i, 0:T].sum(0)]).sink(log_fn)
    bounds = {B: args.num_envs, I: args.iterations, T: d}
    if epochs:
        bounds.update({upd[0][1]: args.update_epochs, upd[1][1]: args.num_minibatches})
    if bc:
        bounds[slot[0][1]] = env.demo_slots(args.num_minibatches)
    if many:
        bounds[syms[-1][1]] = len(settings)
    return checkpoint_and_compile(ctx, args, dnn, i, bounds, **options)

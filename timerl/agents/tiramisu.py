"""Tiramisu-style loop optimisation with PPO as a timerl program (papers/tiramisu_rl.txt,
ch. 2-4): the agent transforms polyhedral loop nests (interchange, reversal, skewing,
parallelisation, tiling, unrolling, next branch; the paper's 56 actions plus fusion,
shift, skew by 2, wavefront skew, one-step time tiling and aligned fusion, deep interchanges (84), illegal ones rejected by
exact isl dependence analysis), every new schedule is compiled with gcc -O3 and timed,
reward log4(speedup over the previous state). The actor-critic is Table 3.2's: two
GATv2 attention layers over the padded AST graph (dense masked attention), mean+max
pooling after each, a summariser, a shared layer, policy and value heads, SELU.
After training the greedy policy optimises the 8 benchmarks (``python -m timerl.envs.tiramisu.evaluate``).

Public API (``examples/ppo_tiramisu.py`` is the training script around it, and
``python -m timerl.envs.tiramisu.evaluate`` the evaluation)::

    from timerl.agents import tiramisu
    args = tiramisu.TiramisuArgs(num_envs=8, iterations=40)
    ex, env = tiramisu.build(args, log_fn)      # the training program, compiled
    ex.execute()
    weights = tiramisu.latest_weights("runs/ppo_tiramisu/checkpoints")
    records = tiramisu.greedy_rollouts(args, weights, programs)
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

import timerl as trl
from timerl.agents import ppo
from timerl.agents.ppo import bc_loss, sil_loss  # shared with ppo.build's imitation
from timerl.envs.tiramisu.actions import NUM_ACTIONS
from timerl.envs.tiramisu.features import MAX_NODES, NUM_FEATURES
from timerl.run import RunArgs, checkpoint_and_compile


@dataclass
class TiramisuArgs(RunArgs):
    """The agent's hyperparameters and the run flags (``RunArgs``); every field is a flag of
    ``examples/ppo_tiramisu.py``, its docstring the ``--help`` line."""

    env_id: str = "tiramisu.benchmarks"
    """the program set: tiramisu.benchmarks (the paper trains and evaluates on them),
    tiramisu.random (generated nests), or one benchmark (tiramisu.mvt)"""
    backend: str = "torch"
    """tensor backend: jax or torch"""
    num_envs: int = 8
    """parallel environments (the batch dim b); one program each per episode"""
    iterations: int = 40
    """PPO updates (the dim i); each runs one episode per env (the paper: 500 x 512 steps)"""
    episode_len: int = 8
    """actions per episode at most (an episode also ends with next on the last branch)"""
    num_programs: int = 64
    """tiramisu.random: how many generated programs"""
    lr: float = 1e-3
    """Adam learning rate, annealed linearly to 0 (Table 4.2: 1e-4 over 500 x 32 Adam
    steps; here ~80 steps). The paper's weight decay 1e-4 is left out: timerl's Adam has none"""
    gamma: float = 0.99
    """discount factor (Table 4.2)"""
    gae_lambda: float = 0.95
    """GAE lambda (Table 4.2)"""
    clip_coef: float = 0.3
    """surrogate clipping epsilon (Table 4.2)"""
    vf_coef: float = 2.0
    """value-loss coefficient c1 (Table 4.2)"""
    ent_coef: float = 0.1
    """entropy coefficient c2 at the start, decayed linearly to 0 (Table 4.2: 0.5 -> 0 over
    500 updates; with ~80 updates 0.5 keeps the policy near uniform)"""
    update_epochs: int = 8
    """epochs over each rollout (Table 4.2: 4; 8 here, where each iteration is one short episode
    per env; > 1 adds a second forward pass over the rollout: the program compiles in ~155 s
    instead of ~45 s; 1: one update per rollout)"""
    num_minibatches: int = 2
    """minibatches per epoch (the paper: 512 / 64 = 8)"""
    norm_adv: bool = True
    """normalise advantages per iteration"""
    heads: int = 4
    """attention heads per GATv2 layer (Table 3.2: 4)"""
    hidden: int = 64
    """channels per head and width of the dense layers (Table 3.2: 64)"""
    arch: str = "v2"
    """v1: Table 3.2's network; v2: plus an input skip (the raw node features, mean+max
    pooled, projected into the summariser beside the two GAT layers' pools), so program
    identity reaches the heads without passing the attention layers"""
    mask: str = "legal"
    """action masking: structural (actions that do not apply: a level beyond the nest, a
    second parallel loop, ...), legal (also the illegal ones: one dependence check per
    action and step), none"""
    eval_mask: str = "legal"
    """the masking of the greedy evaluation rollouts"""
    threads: int = 1
    """OpenMP threads of the measured programs (0: the CPU count). 1 by default: serial kernels
    are timed with the process CPU-time clock, which other jobs on a shared machine do not
    inflate (docs/tiramisu.md, "Measurement"); with 2+ threads the wall clock is used and
    parallel loops can pay"""
    ray_address: str = ""
    """compile and time on a Ray measurement farm: the cluster's host:port (what `ray start
    --head` prints), or local for a Ray started on this machine; empty: in this process
    (docs/distributed.md)"""
    farm_workers: int = 0
    """with --ray-address: measurement workers, one pinned core each (0: one per CPU of the
    cluster)"""
    surrogate: str = "lgbm"
    """training measurements: lgbm (a cost model of gradient-boosted trees, fitted on the
    disk cache of measurements and refitted as new ones arrive, predicts the time of most
    new schedules; the others are measured: every --surrogate-every-th, uncertain ones, and
    ones that may be among the episode's best), off (measure every new schedule). The
    evaluation always measures"""
    surrogate_every: int = 4
    """with --surrogate lgbm: measure at least every N-th schedule not in the cache"""
    surrogate_std: float = 0.15
    """with --surrogate lgbm: measure when the ensemble's spread of the predicted log
    speedup exceeds this"""
    sil_coef: float = 1.0
    """self-imitation (Oh et al. 2018; 0: off): weight of the loss ``-log pi(a|s) max(R - V, 0)
    + sil_vf / 2 max(R - V, 0)^2`` on the steps that replay a program's best measured
    episode so far (see --demo-prob); those steps leave the PPO loss and the advantage
    statistics"""
    demo_prob: float = 0.25
    """with --sil-coef > 0: the chance that a training episode first replays its program's
    best measured episode so far (the actions up to its fastest schedule), then goes on
    with the policy"""
    demo_min_speedup: float = 1.1
    """with --sil-coef > 0 or --bc-coef > 0: replay / imitate a program's best episode only
    once it reaches this speedup"""
    sil_vf: float = 0.01
    """with --sil-coef > 0: the value term's weight beta in the self-imitation loss"""
    bc_coef: float = 0.25
    """buffer imitation (0: off): weight of the cross-entropy ``-log pi(a|s)`` on the states
    and actions of each program's best measured training episode so far (those reaching
    --demo-min-speedup), replayed from the program's initial state without measurements and
    added to every PPO update (minibatch m of M imitates the programs p with p % M == m, so
    each epoch imitates every program once, as it sees every rollout step once; summed over a
    demonstration's steps, divided by --num-envs like the PPO loss); spends no env episodes"""
    seed: int = 0
    """random seed"""
    progress: bool = True
    """progress bar with the time left (off: as --quiet)"""
    out_dir: str = "runs/ppo_tiramisu"
    """where checkpoints, train.json, metrics.csv, TensorBoard events and learning_curve.png go"""


def _selu(x):
    return 1.0507009873554805 * (x.relu() + 1.6732632423543772 * ((-(-x).relu()).exp() - 1.0))


def _leaky(x, slope: float = 0.2):
    return x.relu() - slope * (-x).relu()


def _cols(x, a: int, b: int):
    """``x[..., a:b]`` on the last per-point dim of a flat observation."""
    return x[(*x.domain, slice(a, b))] if x.domain else x[slice(a, b)]


INPUT_GAIN = 1.0  # arch v2: init gain of the input skip (mean+max of the raw node features)


def _init(rng: np.random.Generator, fan_in: int, fan_out: int, gain: float = 1.0) -> np.ndarray:
    return (rng.standard_normal((fan_in, fan_out)) * gain / math.sqrt(fan_in)).astype(np.float32)


class GATPolicy:
    """Table 3.2's actor-critic over the padded AST graph, as RTs.

    Interface of ``timerl.nn.DNN`` that ``ppo`` uses: ``policy(obs)`` samples,
    ``log_prob(a)``, ``entropy()``, ``value()`` reuse that forward pass, ``evaluate(obs,
    a)`` runs a new one, ``at(*index)`` reads the parameters at a point, ``params``,
    ``checkpoint`` via ``policy[cond].checkpoint(path)``. ``mask`` (an RT of 0/1 per
    action, at the points of ``obs``) removes actions from the distribution.
    """

    def __init__(
        self,
        domain: tuple,
        seed: int,
        heads: int,
        hidden: int,
        weights: dict | None = None,
        arch: str = "v1",
    ) -> None:
        if arch not in ("v1", "v2"):
            raise trl.TimeRLError(f"GATPolicy: arch must be v1 or v2, got {arch!r}")
        weights = dict(weights or {})
        self.heads, self.hidden, self.arch = heads, hidden, arch
        shapes = self.init_weights(seed, heads, hidden, arch)
        self.domain = tuple(domain)
        self.p: dict[str, Any] = {}
        for name, init in shapes.items():
            if name in weights:
                init = np.asarray(weights.pop(name), np.float32)
            self.p[name] = trl.param(init, self.domain, name=name)
        if weights:
            raise trl.TimeRLError(f"GATPolicy: unknown weights {sorted(weights)}")
        self.params = list(self.p.values())
        self._last: tuple | None = None

    @staticmethod
    def init_weights(seed: int, heads: int, hidden: int, arch: str = "v1") -> dict[str, np.ndarray]:
        """The initial parameters by name (``arch`` v2 adds ``dnn.inp``: the input skip)."""
        rng = np.random.default_rng(seed)
        hc = heads * hidden
        shapes: dict[str, np.ndarray] = {}

        def lin(name: str, fi: int, fo: int, gain: float = 1.0) -> None:
            shapes[f"dnn.{name}.w"] = _init(rng, fi, fo, gain)
            shapes[f"dnn.{name}.b"] = np.zeros(fo, np.float32)

        for k, fin in ((1, NUM_FEATURES), (2, hidden)):
            shapes[f"dnn.gat{k}.wl"] = _init(rng, fin, hc)
            shapes[f"dnn.gat{k}.wr"] = _init(rng, fin, hc)
            shapes[f"dnn.gat{k}.att"] = _init(rng, hidden, heads).T.copy()
            shapes[f"dnn.gat{k}.bias"] = np.zeros(hc, np.float32)
            lin(f"lin{k}", hc, hidden)
        lin("summ", (6 if arch == "v2" else 4) * hidden, 2 * hidden)
        lin("shared", 2 * hidden, hidden)
        for head, out, gain in (("pi", NUM_ACTIONS, 0.01), ("v", 1, 1.0)):
            lin(f"{head}0", hidden, hidden)
            lin(f"{head}1", hidden, hidden)
            lin(f"{head}2", hidden, out, gain)
        if arch == "v2":
            lin("inp", 2 * NUM_FEATURES, 2 * hidden, INPUT_GAIN)
        return shapes

    # -- network ---------------------------------------------------------------------
    def _gat(self, k: int, x, adj):
        n, h, c = MAX_NODES, self.heads, self.hidden
        xl = (x @ self.p[f"dnn.gat{k}.wl"]).reshape(n, h, c)
        xr = (x @ self.p[f"dnn.gat{k}.wr"]).reshape(n, h, c)
        s = _leaky(
            xr.unsqueeze(1) + xl.unsqueeze(0)
        )  # (i, j, h, c): GATv2 scores a^T LeakyReLU(Wr x_i + Wl x_j)
        e = (s * self.p[f"dnn.gat{k}.att"]).sum(-1) + (adj.unsqueeze(-1) - 1.0) * 1e9
        alpha = trl.softmax(e, 1)  # over the neighbours j of i
        out = (alpha.unsqueeze(-1) * xl.unsqueeze(0)).sum(1).reshape(n, h * c)
        return out + self.p[f"dnn.gat{k}.bias"]

    def _lin(self, name: str, x):
        return x @ self.p[f"dnn.{name}.w"] + self.p[f"dnn.{name}.b"]

    def _trunk(self, obs):
        n, f = MAX_NODES, NUM_FEATURES
        x = _cols(obs, 0, n * f).reshape(n, f)
        adj = _cols(obs, n * f, n * f + n * n).reshape(n, n)
        m = _cols(obs, n * f + n * n, n * f + n * n + n).unsqueeze(-1)  # (n, 1) node mask
        pooled = []
        if self.arch == "v2":  # the raw features, pooled, straight to the summariser
            mean_x = (x * m).sum(0) / m.sum(0)
            max_x = (x + (m - 1.0) * 1e9).max(0)
            pooled.append(self._lin("inp", trl.cat([mean_x, max_x], 0)))
        h = x
        for k in (1, 2):
            h = _selu(self._lin(f"lin{k}", self._gat(k, h, adj)))
            mean = (h * m).sum(0) / m.sum(0)
            mx = (h + (m - 1.0) * 1e9).max(0)
            pooled.append(trl.cat([mean, mx], 0))
        z = _selu(self._lin("summ", trl.cat(pooled, 0)))
        return _selu(self._lin("shared", z))

    def _head(self, name: str, z):
        z = _selu(self._lin(f"{name}0", z))
        z = _selu(self._lin(f"{name}1", z))
        return self._lin(f"{name}2", z)

    def _outputs(self, obs, mask):
        z = self._trunk(obs)
        logits = self._head("pi", z)
        if mask is not None:
            logits = logits + (mask - 1.0) * 1e9
        return logits, self._head("v", z).squeeze(-1)

    # -- the DNN interface ppo uses ------------------------------------------------------
    def __call__(self, obs, mask=None):
        logits, v = self._outputs(obs, mask)
        self._last = (logits, v)
        u = trl.rand(logits.shape, logits.domain)
        return (logits - (-(u + 1e-10).log() + 1e-10).log()).argmax(-1)  # Gumbel-max sample

    def forward(self, obs, mask=None):
        return self._outputs(obs, mask)[0]

    def value(self, obs=None, mask=None):
        if obs is not None:
            return self._outputs(obs, mask)[1]
        return self._last[1]

    @staticmethod
    def _logp(logits, a):
        lp = trl.log_softmax(logits, -1)
        onehot = (trl.const(np.arange(NUM_ACTIONS, dtype=np.int64)) == a.cast(trl.int64).unsqueeze(-1)).cast(
            trl.float32
        )
        return (lp * onehot).sum(-1)

    @staticmethod
    def _entropy(logits):
        lp = trl.log_softmax(logits, -1)
        return -(lp.exp() * lp).sum(-1)

    def log_prob(self, a):
        return self._logp(self._last[0], a)

    def entropy(self):
        return self._entropy(self._last[0])

    def evaluate(self, obs, a, mask=None):
        logits, v = self._outputs(obs, mask)
        return self._logp(logits, a), self._entropy(logits), v

    def at(self, *index) -> GATPolicy:
        index = index[: len(self.domain)]
        view = copy.copy(self)
        view.p = {k: w[index] for k, w in self.p.items()}
        view._last = None
        return view

    def __getitem__(self, cond) -> Any:
        outer = self

        class _View:
            def checkpoint(self, path: str, config: dict | None = None) -> None:
                for w in outer.params:
                    (w if cond is None else w[cond]).checkpoint(path, config)

        return _View()


def make_env(args: TiramisuArgs, B, **kw):
    kw.setdefault("surrogate", args.surrogate)
    if args.sil_coef > 0.0 and kw.get("split", "train") == "train":
        kw.setdefault("demo_prob", args.demo_prob)
        kw.setdefault("demo_min_speedup", args.demo_min_speedup)
    if kw["surrogate"] != "off":
        kw.setdefault(
            "surrogate_options",
            {"measure_every": args.surrogate_every, "max_std": args.surrogate_std, "seed": args.seed},
        )
    if args.ray_address and kw.get("measurer") is None:
        from timerl.dist.farm import farm_from_flags

        kw["farm"] = farm_from_flags(args.ray_address, args.farm_workers)
    return trl.env.make(
        args.env_id,
        num_envs=B,
        seed=args.seed,
        episode_len=args.episode_len,
        num_programs=args.num_programs,
        threads=args.threads or None,
        **kw,
    )


def build(args: TiramisuArgs, log_fn, env_fn=make_env, weights=None):
    """PPO (ppo.py's program) with the GATv2 actor-critic, action masking and the decaying
    entropy coefficient. With several epochs or minibatches they are dims (e, m) and each
    (e, m) runs a new forward pass over the stored rollout (Table 4.2's 4 epochs); with one
    of each the acting forward pass is the one differentiated (TimeRL's setting: a smaller
    program, so a faster compile and run)."""
    epochs = args.update_epochs > 1 or args.num_minibatches > 1
    bc = args.bc_coef > 0.0
    dims = ("b", "i", "e", "m", "t") if epochs else ("b", "i", "t")
    ctx = trl.Context(dims=dims + ("k",) if bc else dims)  # k: the imitation buffer's slots
    with ctx as syms:
        (b, B), (i, I) = syms[:2]
        upd, (t, T), slot = syms[2 : len(dims) - 1], syms[len(dims) - 1], syms[len(dims) :]
        env = env_fn(args, B)
        dnn = GATPolicy((i, *(s for s, _ in upd)), args.seed, args.heads, args.hidden, weights, args.arch)
        actor = dnn.at(i, 0, 0) if epochs else dnn
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        mask = env.action_mask(o, legal=args.mask == "legal") if args.mask != "none" else None
        a = actor(o, mask)
        sil = args.sil_coef > 0.0
        if sil:
            a, demo = env.demo_actions(a, mask)  # a replayed best episode's actions where it plays one
        v = actor.value()
        o[b, i, t + 1], r, d = env.step(a)
        alive, adv, ret = ppo.gae(args, b, i, t, T, v, r, d)
        own = alive * (1.0 - demo) if sil else alive  # the policy's own steps
        adv_n = ppo.normalise(args, adv, own, B, i, T)
        logp_old = actor.log_prob(a)
        ent_coef = args.ent_coef * (1.0 - trl.as_tensor(i) / float(args.iterations))
        run = copy.copy(args)
        run.ent_coef = 0.0
        if epochs:
            m = upd[1][0]
            logp, ent, v_new = dnn.evaluate(o, a, mask)  # parameters at (i, e, m)
            step_mb = trl.as_tensor(t % args.num_minibatches, domain=(i,))
            in_mb = (step_mb == trl.as_tensor(m)).cast(trl.float32)
        else:
            logp, ent, v_new, in_mb = logp_old, actor.entropy(), v, 1.0
        per_point = ppo.clipped_loss(run, logp, logp_old, ent, v_new, ret, adv_n)
        if sil:
            imitate = args.sil_coef * sil_loss(logp, ret, v_new, args.sil_vf)
            per_point = per_point * (1.0 - demo) + imitate * demo
        per_point = per_point - ent_coef * ent
        loss = per_point * in_mb * alive / float(args.num_envs)
        loss.backward()
        if bc:  # every update also imitates each program's best episode, from the buffer
            k, K = slot[0]
            part = upd[1][0] if epochs else None  # minibatch m imitates the programs p % M == m
            o_d, mask_d, a_d, w_d = env.demo_buffer(
                (i, part, k) if epochs else (i, k),
                k,
                K,
                legal=args.mask == "legal",
                min_speedup=args.demo_min_speedup,
                after=[r[0:B, i, 0:T].sum()],  # after iteration i's episodes (they may add one)
                part=part,
                parts=args.num_minibatches,
            )
            logp_d, _, _ = dnn.evaluate(o_d, a_d, mask_d if args.mask != "none" else None)
            (bc_loss(logp_d, w_d) * (args.bc_coef / float(args.num_envs))).backward()
        lr = args.lr * (1.0 - trl.as_tensor(i) / float(args.iterations))
        trl.optim.Adam(dnn.params, lr=lr).step()
        trl.stack([r[b, i, 0:T].sum(0), alive[b, i, 0:T].sum(0)]).sink(log_fn)
    bounds = {B: args.num_envs, I: args.iterations, T: d}
    if epochs:
        bounds.update({upd[0][1]: args.update_epochs, upd[1][1]: args.num_minibatches})
    if bc:
        bounds[slot[0][1]] = -(-len(env.tasks) // args.num_minibatches) * args.episode_len
    return checkpoint_and_compile(ctx, args, dnn, i, bounds), env


def latest_weights(ckpt_dir: str) -> dict[str, np.ndarray]:
    """The parameters (``dnn.*``) at their latest point in the latest checkpoint."""
    from timerl.runtime.checkpoint import read_values

    return {
        name: by_point[max(by_point)]
        for name, by_point in read_values(ckpt_dir).items()
        if name.startswith("dnn.") and ".adam_" not in name
    }


def greedy_rollouts(args: TiramisuArgs, weights: dict, programs: list, measurer=None) -> list:
    """One greedy episode per program with the trained policy (an RT program of its own);
    the env's episode records (the last schedule of each is the agent's result). Every
    schedule is measured (no surrogate, whatever ``args.surrogate`` says)."""
    return [eps[0] for eps in _rollouts(args, weights, programs, measurer, 1, sample=False)]


def sampled_rollouts(
    args: TiramisuArgs, weights: dict, programs: list, episodes: int, measurer=None, seed: int | None = None
) -> list[list]:
    """``episodes`` episodes per program sampled from the trained policy (with
    ``args.eval_mask``), every schedule measured (no surrogate): per program, its episode
    records in order. The best-of-K evaluation picks the fastest schedule they measured.
    ``seed`` (default ``args.seed``) seeds the sampling."""
    if episodes < 1:
        raise trl.TimeRLError(f"sampled_rollouts: episodes must be >= 1, got {episodes}")
    return _rollouts(args, weights, programs, measurer, episodes, sample=True, seed=seed)


def _rollouts(
    args: TiramisuArgs,
    weights: dict,
    programs: list,
    measurer,
    episodes: int,
    sample: bool,
    seed: int | None = None,
) -> list[list]:
    B = len(programs)
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, Bs), (i, I), (t, T)):
        env = make_env(args, Bs, split="test", programs=programs, measurer=measurer, surrogate="off")
        arch = "v2" if "dnn.inp.w" in weights else "v1"
        dnn = GATPolicy((), args.seed, args.heads, args.hidden, weights, arch)
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))  # in order: env b plays programs[b] at every i
        mask = env.action_mask(o, legal=args.eval_mask == "legal") if args.eval_mask != "none" else None
        a = dnn(o, mask) if sample else dnn.forward(o, mask).argmax(-1)
        o[b, i, t + 1], _, d = env.step(a)
    ctx.compile(
        {Bs: B, I: episodes, T: d}, backend=args.backend, seed=args.seed if seed is None else seed
    ).execute()
    by_env: dict[int, list] = {k: [] for k in range(B)}
    for rec in sorted(env.history, key=lambda r: r.reset_point):
        by_env[rec.env_index].append(rec)
    return [by_env[k] for k in range(B)]

"""PPO side by side: timerl (JAX and Torch backends, passes on and off) against an eager
PyTorch PPO in the CleanRL style and a PPO whose whole iteration is one ``jax.jit`` call.

One iteration, in every program: a rollout of ``--num-steps`` steps in ``--num-envs``
CartPole-v1 envs, GAE(0.99, 0.95) over it, advantages normalised over the rollout, then one
epoch of clipped-PPO updates (clip 0.2, value coefficient 0.5, entropy 0.01) over
``--num-minibatches`` minibatches with Adam (lr 2.5e-4 annealed linearly). Actor and critic
are separate MLPs, ``--layers`` hidden layers of ``--hidden`` tanh units. timerl runs
``examples/ppo.py``'s ``build_fixed`` (its minibatch m holds the steps t with t % M == m; the
baselines shuffle); the two baselines here are written to do the same arithmetic.

Envs (``--env``): ``gym`` is gymnasium's NumPy-vectorised CartPole (``CartPoleVectorEnv``, the
env behind timerl's ``gym.CartPole-v1``); ``gymnax`` is gymnax's JAX CartPole (timerl's
``gymnax.CartPole-v1``; the single-jit PPO scans it inside the jitted iteration; the eager
torch PPO steps it as one jitted call per step, arrays crossing by DLPack). With ``gym`` the
"jax-jit" program cannot put the host env inside the jit: it jits the acting step (one call
per env step) and the whole learning phase (one call per iteration).

Every program runs in its own subprocess (so peak RSS, VmHWM, is its own), with
``OMP_NUM_THREADS=1`` and, where it uses torch, ``torch.set_num_threads(1)`` (the JAX
programs never import torch: its ~0.2 GB would count in their RSS). Reported per program: the compile
time (timerl: trace -> passes -> schedule -> AST; jitted baselines compile in their first
iteration), the first iteration's time, the median time of ``--iterations`` iterations after
``--warmup`` untimed ones, env steps per second from that median, peak RSS, and the ratio
of env steps/s to the eager torch PPO on the same env.

    python benchmarks/ppo_side_by_side.py                       # 512 x 250, both envs
    python benchmarks/ppo_side_by_side.py --num-envs 64 --num-steps 128 --env gymnax
    python benchmarks/ppo_side_by_side.py --sweep               # Fig. 9 axes, reduced; PNG

``benchmarks/peers.py`` runs these programs' timerl, eager torch and single-jit runners beside
Stable-Baselines3's and RLlib's PPO (each from its own virtualenv), pinned alike, as one table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ALL_PROGRAMS = (
    "torch-eager",
    "jax-jit",
    "timerl-jax",
    "timerl-torch",
    "timerl-jax-nopass",
    "timerl-torch-nopass",
    "timerl-jax-scan",
)
ENVS = ("gym", "gymnax")


@dataclass
class Config:
    env: str = "both"
    """gym (gymnasium's NumPy CartPole), gymnax (JAX CartPole) or both"""
    num_envs: int = 512
    """parallel envs"""
    num_steps: int = 250
    """steps per rollout (T)"""
    iterations: int = 4
    """timed iterations (after the warm-up ones)"""
    warmup: int = 4
    """untimed iterations first (jit compilation: timerl-jax compiles regions during its first
    three rollout-to-rollout intervals; timerl-torch's third and fourth iterations were still
    0.5-0.6 s where later ones took 0.4 s)"""
    programs: str = ",".join(ALL_PROGRAMS[:6])
    """comma-separated subset of: torch-eager, jax-jit, timerl-jax, timerl-torch,
    timerl-jax-nopass, timerl-torch-nopass, timerl-jax-scan (-nopass: vectorize_time=False,
    contract=False; -scan: scan_loops=True, static loops as one lax.scan)"""
    hidden: int = 64
    """hidden units per layer"""
    layers: int = 2
    """hidden layers (actor and critic each)"""
    num_minibatches: int = 1
    """minibatches of the one update epoch, in every program (1: TimeRL's configuration, one
    update over the whole rollout, acting activations reused; M > 1: the rollout shuffled and cut
    into M minibatches, each a new forward pass over its B * T / M samples, as CleanRL)"""
    seed: int = 0
    """random seed"""
    timeout: int = 1800
    """seconds one program may run before it is stopped (reported as such)"""
    sweep: bool = False
    """redo TimeRL's Fig. 9 axes (episode length, hidden size, layers, envs) at reduced sizes"""
    sweep_programs: str = "torch-eager,jax-jit,timerl-jax,timerl-torch"
    """programs of the sweep"""
    sweep_points: int = 3
    """values per sweep axis: 3 (smaller, base, larger) or 2 (base, larger)"""
    out: str = "runs/ppo_side_by_side"
    """where results (JSON) and the sweep's PNG go"""
    child: str = ""
    """(internal) run this one program in this process and print its result"""


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    d = Config()
    doc = {f.name: _field_doc(f.name) for f in fields(Config)}
    for f in fields(Config):
        v = getattr(d, f.name)
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(v, bool):
            p.add_argument(flag, action="store_true", help=doc[f.name])
        else:
            p.add_argument(flag, type=type(v), default=v, help=doc[f.name])
    return Config(**vars(p.parse_args(argv)))


def _field_doc(name: str) -> str:
    """The docstring under a ``Config`` field (the CleanRL habit), for ``--help``."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(Config))
    body = tree.body[0].body  # type: ignore[attr-defined]
    for k, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == name and k + 1 < len(body):
            nxt = body[k + 1]
            if isinstance(nxt, ast.Expr):
                try:
                    return " ".join(str(ast.literal_eval(nxt.value)).split()).replace("%", "%%")
                except ValueError:
                    return ""
    return ""


# --------------------------------------------------------------------------- measuring


def _threads() -> int:
    """torch's intra-op threads: ``OMP_NUM_THREADS`` (1 here, as ``spawn`` sets it;
    ``benchmarks/peers.py`` sets its ``--threads``)."""
    return int(os.environ.get("OMP_NUM_THREADS", "1") or 1)


def _peak_rss_mb() -> float:
    """This process's peak resident set size (VmHWM), in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _result(cfg: Config, compile_s: float, iter_s: list[float], extra: dict[str, Any] | None = None) -> dict:
    timed = iter_s[cfg.warmup :]
    med = statistics.median(timed)
    return {
        "compile_s": compile_s,
        "first_iter_s": iter_s[0],
        "iter_s": iter_s,
        "median_iter_s": med,
        "env_steps_per_s": cfg.num_envs * cfg.num_steps / med,
        "peak_rss_mb": _peak_rss_mb(),
        **(extra or {}),
    }


# --------------------------------------------------------------------------- timerl


def run_timerl(cfg: Config, env: str, backend: str, passes: bool, **extra: bool) -> dict:
    sys.path.insert(0, str(ROOT / "examples"))
    import ppo

    from timerl.backends import import_backend

    args = ppo.Args(
        env_id=f"{env}.CartPole-v1",
        backend=backend,
        num_envs=cfg.num_envs,
        num_steps=cfg.num_steps,
        iterations=cfg.warmup + cfg.iterations,
        lr=2.5e-4,
        ent_coef=0.01,
        hidden=cfg.hidden,
        layers=cfg.layers,
        num_minibatches=cfg.num_minibatches,
        seed=cfg.seed,
    )
    done_at: dict[int, float] = {}

    # An iteration's time is the time between two consecutive sinks of the rollout log (per
    # iteration: every env's rewards and dones, known once i's rollout ends): one full period
    # of acting and learning, shifted by the learning phase; the first one is the first rollout.
    def log_fn(v: Any, pt: dict[str, int]) -> None:
        it = pt["i"]
        done_at[it] = time.perf_counter()
        print(f"iter {it} done at {done_at[it] - t1:.3f}s", flush=True)

    opts = {**({} if passes else {"vectorize_time": False, "contract": False}), **extra}
    import_backend(backend)  # the compile figure leaves out the backend's first import
    env_fn, env_s = ppo.timed_env(ppo.make_env)  # ... and the env's own setup
    t0 = time.perf_counter()
    ex = ppo.build_fixed(args, log_fn, env_fn, **opts)
    t1 = time.perf_counter()
    ex.execute()
    t2 = time.perf_counter()
    n = args.iterations
    if sorted(done_at) != list(range(n)):
        raise RuntimeError(f"iterations completed: {sorted(done_at)}, expected 0..{n - 1}")
    marks = [t1] + [done_at[k] for k in range(n)]
    iter_s = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    return _result(cfg, t1 - t0 - env_s[0], iter_s, {"execute_s": t2 - t1, "env_s": env_s[0]})


# --------------------------------------------------------------------------- envs for the baselines


class _GymnaxBatch:
    """gymnax CartPole, ``B`` envs, reset and step jitted and vmapped (gymnax auto-resets)."""

    def __init__(self, n: int, seed: int) -> None:
        import gymnax
        import jax

        self.env, self.params = gymnax.make("CartPole-v1")
        self.n = n
        self.key = jax.random.PRNGKey(seed)
        env, params = self.env, self.params

        def reset(key: Any) -> Any:
            obs, st = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, n), params)
            return obs, jax.tree_util.tree_map(lambda x: jax.lax.convert_element_type(x, x.dtype), st)

        def step(key: Any, st: Any, a: Any) -> Any:
            key, k = jax.random.split(key)
            obs, st, r, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k, n), st, a.astype("int32"), params
            )
            return key, obs, st, r.astype("float32"), term | trunc

        self._reset, self._step = jax.jit(reset), jax.jit(step)

    def reset(self) -> Any:
        import jax

        self.key, k = jax.random.split(self.key)
        obs, self.state = self._reset(k)
        return obs

    def step(self, action: Any) -> tuple[Any, Any, Any]:

        self.key, obs, self.state, r, d = self._step(self.key, self.state, action)
        return obs, r, d


def _gym_vec(n: int, seed: int) -> tuple[Any, Any]:
    """gymnasium's NumPy CartPole. It only has NEXT_STEP autoreset (the step after an episode
    end resets that env and ignores its action): the same work per step, fine for timing."""
    import gymnasium as gym

    envs = gym.make_vec("CartPole-v1", num_envs=n, vectorization_mode="vector_entry_point")
    obs, _ = envs.reset(seed=seed)
    return envs, obs


# --------------------------------------------------------------------------- eager torch


def run_torch_eager(cfg: Config, env: str) -> dict:
    import numpy as np
    import torch
    from torch import nn

    torch.set_num_threads(_threads())
    torch.manual_seed(cfg.seed)
    B, T, M = cfg.num_envs, cfg.num_steps, cfg.num_minibatches
    n_batch = B * T
    mb = n_batch // M
    gamma, lam, clip, vf, ent_coef, lr0 = 0.99, 0.95, 0.2, 0.5, 0.01, 2.5e-4

    def net(n_out: int, gain: float) -> nn.Sequential:
        mods: list[nn.Module] = []
        width = 4
        for _ in range(cfg.layers):
            lin = nn.Linear(width, cfg.hidden)
            nn.init.orthogonal_(lin.weight, np.sqrt(2.0))
            nn.init.zeros_(lin.bias)
            mods += [lin, nn.Tanh()]
            width = cfg.hidden
        head = nn.Linear(width, n_out)
        nn.init.orthogonal_(head.weight, gain)
        nn.init.zeros_(head.bias)
        return nn.Sequential(*mods, head)

    actor, critic = net(2, 0.01), net(1, 1.0)
    opt = torch.optim.Adam([*actor.parameters(), *critic.parameters()], lr=lr0, eps=1e-5)

    if env == "gym":
        envs, o = _gym_vec(B, cfg.seed)
        obs = torch.from_numpy(o)

        def env_step(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            o, r, term, trunc, _ = envs.step(a.numpy())
            return (
                torch.from_numpy(o),
                torch.from_numpy(r.astype(np.float32)),
                torch.from_numpy(term | trunc),
            )
    else:
        import jax

        jenv = _GymnaxBatch(B, cfg.seed)
        obs = torch.from_dlpack(jenv.reset())

        def env_step(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            o, r, d = jenv.step(jax.dlpack.from_dlpack(a.to(torch.int32)))
            return torch.from_dlpack(o), torch.from_dlpack(r), torch.from_dlpack(d)

    b_obs = torch.zeros((T, B, 4))
    b_act = torch.zeros((T, B), dtype=torch.long)
    b_logp, b_val, b_rew, b_done = (torch.zeros((T, B)) for _ in range(4))
    total = cfg.warmup + cfg.iterations
    iter_s = []
    for it in range(total):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr0 * (1.0 - it / total)
        with torch.no_grad():  # rollout
            for t in range(T):
                dist = torch.distributions.Categorical(logits=actor(obs))
                a = dist.sample()
                b_obs[t], b_act[t], b_logp[t] = obs, a, dist.log_prob(a)
                b_val[t] = critic(obs).squeeze(-1)
                obs, r, d = env_step(a)
                b_rew[t], b_done[t] = r, d.float()
            v_next = critic(obs).squeeze(-1)  # bootstrap from the observation after step T - 1
            adv = torch.zeros((T, B))
            run = torch.zeros(B)
            for t in reversed(range(T)):  # GAE, a Python loop over time
                nd = 1.0 - b_done[t]
                delta = b_rew[t] + gamma * nd * v_next - b_val[t]
                run = delta + gamma * lam * nd * run
                adv[t] = run
                v_next = b_val[t]
            ret = adv + b_val
            adv = (adv - adv.mean()) / (adv.std(unbiased=False) + 1e-8)
        f_obs, f_act, f_logp = b_obs.reshape(n_batch, 4), b_act.reshape(-1), b_logp.reshape(-1)
        f_adv, f_ret = adv.reshape(-1), ret.reshape(-1)
        perm = torch.randperm(n_batch)
        for k in range(M):  # one epoch of shuffled minibatches
            idx = perm[k * mb : (k + 1) * mb]
            dist = torch.distributions.Categorical(logits=actor(f_obs[idx]))
            ratio = (dist.log_prob(f_act[idx]) - f_logp[idx]).exp()
            pg = torch.max(-f_adv[idx] * ratio, -f_adv[idx] * ratio.clamp(1 - clip, 1 + clip)).mean()
            v_loss = 0.5 * ((critic(f_obs[idx]).squeeze(-1) - f_ret[idx]) ** 2).mean()
            loss = pg + vf * v_loss - ent_coef * dist.entropy().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        loss.item()
        iter_s.append(time.perf_counter() - t0)
        print(f"iter {it} {iter_s[-1]:.3f}s", flush=True)
    return _result(cfg, 0.0, iter_s)


# --------------------------------------------------------------------------- single-jit JAX


def run_jax_jit(cfg: Config, env: str) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    B, T, M = cfg.num_envs, cfg.num_steps, cfg.num_minibatches
    n_batch = B * T
    mb = n_batch // M
    gamma, lam, clip, vf, ent_coef, lr0 = 0.99, 0.95, 0.2, 0.5, 0.01, 2.5e-4
    total = cfg.warmup + cfg.iterations
    ortho = jax.nn.initializers.orthogonal

    def init_net(key: Any, n_out: int, gain: float) -> list[tuple[Any, Any]]:
        sizes = [4] + [cfg.hidden] * cfg.layers
        keys = jax.random.split(key, len(sizes))
        layers = [
            (ortho(np.sqrt(2.0))(k, (a, b)), jnp.zeros(b))
            for k, a, b in zip(keys, sizes, sizes[1:], strict=False)
        ]
        return [*layers, (ortho(gain)(keys[-1], (sizes[-1], n_out)), jnp.zeros(n_out))]

    def forward(layers: list[tuple[Any, Any]], x: Any) -> Any:
        for w, b in layers[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def policy(params: dict, obs: Any) -> tuple[Any, Any]:
        return jax.nn.log_softmax(forward(params["pi"], obs)), forward(params["v"], obs)[..., 0]

    def adam(params: Any, grads: Any, st: tuple, lr: Any) -> tuple[Any, tuple]:
        m, v, n = st
        n = n + 1
        m = jax.tree_util.tree_map(lambda m_, g: 0.9 * m_ + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda v_, g: 0.999 * v_ + 0.001 * g * g, v, grads)
        c1, c2 = 1.0 - 0.9**n, 1.0 - 0.999**n
        params = jax.tree_util.tree_map(
            lambda p, m_, v_: p - lr * (m_ / c1) / (jnp.sqrt(v_ / c2) + 1e-5), params, m, v
        )
        return params, (m, v, n)

    def learn(params: dict, opt: tuple, traj: tuple, obs_after: Any, lr: Any, key: Any) -> tuple:
        """GAE (a reverse scan), normalised advantages, one epoch of shuffled minibatches."""
        obs, act, logp, val, rew, done = traj
        _, v_last = policy(params, obs_after)

        def gae_step(carry: tuple, x: tuple) -> tuple:
            run, v_next = carry
            r, d, v = x
            nd = 1.0 - d
            run = r + gamma * nd * v_next - v + gamma * lam * nd * run
            return (run, v), run

        _, adv = jax.lax.scan(gae_step, (jnp.zeros(B), v_last), (rew, done, val), reverse=True)
        ret = adv + val
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        flat = [x.reshape((n_batch,) + x.shape[2:]) for x in (obs, act, logp, adv, ret)]
        perm = jax.random.permutation(key, n_batch)[: M * mb].reshape(M, mb)

        def loss_fn(p: dict, o: Any, a: Any, lp: Any, ad: Any, rt: Any) -> Any:
            logits, v = policy(p, o)
            new_lp = jnp.take_along_axis(logits, a[:, None], axis=1)[:, 0]
            ratio = jnp.exp(new_lp - lp)
            pg = jnp.maximum(-ad * ratio, -ad * jnp.clip(ratio, 1 - clip, 1 + clip)).mean()
            ent = -(jnp.exp(logits) * logits).sum(-1).mean()
            return pg + vf * 0.5 * ((v - rt) ** 2).mean() - ent_coef * ent

        def mb_step(carry: tuple, idx: Any) -> tuple:
            p, st = carry
            loss, g = jax.value_and_grad(loss_fn)(p, *(x[idx] for x in flat))
            p, st = adam(p, g, st, lr)
            return (p, st), loss

        (params, opt), losses = jax.lax.scan(mb_step, (params, opt), perm)
        return params, opt, losses[-1]

    key = jax.random.PRNGKey(cfg.seed)
    k_pi, k_v, key = jax.random.split(key, 3)
    params = {"pi": init_net(k_pi, 2, 0.01), "v": init_net(k_v, 1, 1.0)}
    zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
    opt = (zeros, zeros, jnp.zeros((), jnp.int32))
    iter_s = []

    if env == "gymnax":
        jenv = _GymnaxBatch(B, cfg.seed)
        obs0 = jenv.reset()
        env_step = jenv._step

        @jax.jit
        def iteration(params: dict, opt: tuple, env_state: Any, obs: Any, key: Any, lr: Any) -> tuple:
            def step(c: tuple, _: Any) -> tuple:
                st, o, k = c
                k, k_a = jax.random.split(k)
                logits, v = policy(params, o)
                a = jax.random.categorical(k_a, logits)
                lp = jnp.take_along_axis(logits, a[:, None], axis=1)[:, 0]
                k, o2, st, r, d = env_step(k, st, a)
                return (st, o2, k), (o, a, lp, v, r, d.astype(jnp.float32))

            (env_state, obs, key), traj = jax.lax.scan(step, (env_state, obs, key), None, length=T)
            key, k_perm = jax.random.split(key)
            params, opt, loss = learn(params, opt, traj, obs, lr, k_perm)
            return params, opt, env_state, obs, key, loss

        env_state, obs = jenv.state, obs0
        for it in range(total):
            t0 = time.perf_counter()
            lr = jnp.float32(lr0 * (1.0 - it / total))
            params, opt, env_state, obs, key, loss = iteration(params, opt, env_state, obs, key, lr)
            float(loss)
            iter_s.append(time.perf_counter() - t0)
            print(f"iter {it} {iter_s[-1]:.3f}s", flush=True)
        return _result(cfg, 0.0, iter_s)

    # gym: the host env stays outside; acting is one jitted call per step, learning one per iteration
    envs, o = _gym_vec(B, cfg.seed)

    @jax.jit
    def act(params: dict, obs: Any, key: Any) -> tuple:
        key, k_a = jax.random.split(key)
        logits, v = policy(params, obs)
        a = jax.random.categorical(k_a, logits)
        return a, jnp.take_along_axis(logits, a[:, None], axis=1)[:, 0], v, key

    learn_jit = jax.jit(learn)
    for it in range(total):
        t0 = time.perf_counter()
        lr = jnp.float32(lr0 * (1.0 - it / total))
        cols: list[list[Any]] = [[] for _ in range(6)]
        for _ in range(T):
            a, lp, v, key = act(params, o, key)
            a_np = np.asarray(a)
            o2, r, term, trunc, _ = envs.step(a_np)
            for c, x in zip(
                cols, (o, a_np, lp, v, r.astype(np.float32), (term | trunc).astype(np.float32)), strict=True
            ):
                c.append(x)
            o = o2
        traj = tuple(jnp.stack(c) for c in cols)
        key, k_perm = jax.random.split(key)
        params, opt, loss = learn_jit(params, opt, traj, jnp.asarray(o), lr, k_perm)
        float(loss)
        iter_s.append(time.perf_counter() - t0)
        print(f"iter {it} {iter_s[-1]:.3f}s", flush=True)
    return _result(cfg, 0.0, iter_s)


# --------------------------------------------------------------------------- driver


def run_child(cfg: Config) -> None:
    prog, env = cfg.child.split(":")
    runners: dict[str, Callable[[], dict]] = {
        "torch-eager": lambda: run_torch_eager(cfg, env),
        "jax-jit": lambda: run_jax_jit(cfg, env),
        "timerl-jax": lambda: run_timerl(cfg, env, "jax", True),
        "timerl-torch": lambda: run_timerl(cfg, env, "torch", True),
        "timerl-jax-nopass": lambda: run_timerl(cfg, env, "jax", False),
        "timerl-torch-nopass": lambda: run_timerl(cfg, env, "torch", False),
        "timerl-jax-scan": lambda: run_timerl(cfg, env, "jax", True, scan_loops=True),
    }
    if prog.startswith("timerl-torch") or prog == "torch-eager":  # timerl-jax never imports torch
        import torch

        torch.set_num_threads(_threads())
    res = runners[prog]()
    print("RESULT " + json.dumps(res), flush=True)


def spawn(cfg: Config, prog: str, env: str, log: Any) -> dict:
    """Run one program in a subprocess; its result (or why there is none)."""
    argv = [sys.executable, __file__, "--child", f"{prog}:{env}"]
    for f in fields(Config):
        if f.name in ("child", "sweep", "env", "programs", "sweep_programs", "sweep_points"):
            continue
        argv += [f"--{f.name.replace('_', '-')}", str(getattr(cfg, f.name))]
    envv = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    envv["PYTHONPATH"] = os.pathsep.join(x for x in (str(ROOT), envv.get("PYTHONPATH", "")) if x)
    t0 = time.perf_counter()
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=cfg.timeout, env=envv, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        log.write(f"=== {prog} {env}: timed out after {cfg.timeout}s\n{exc.stdout or ''}\n")
        return {"error": f"timeout {cfg.timeout}s"}
    log.write(f"=== {prog} {env} rc={out.returncode} wall={time.perf_counter() - t0:.1f}s\n")
    log.write(out.stdout + "\n" + out.stderr[-5000:] + "\n")
    log.flush()
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    tail = (out.stderr.strip().splitlines() or ["?"])[-1]
    return {"error": f"rc={out.returncode}: {tail[:200]}"}


def table(cfg: Config, env: str, results: dict[str, dict]) -> str:
    base = results.get("torch-eager", {}).get("env_steps_per_s")
    rows = [
        f"{env}: {cfg.num_envs} envs x {cfg.num_steps} steps, {cfg.layers}x{cfg.hidden} tanh, 1 epoch, "
        f"{cfg.num_minibatches} minibatches; {cfg.warmup} warm-up + {cfg.iterations} timed iterations",
        "| program | compile s | first iter s | median iter s | env steps/s | vs eager torch | peak RSS MB |",
        "|---|---|---|---|---|---|---|",
    ]
    for prog, r in results.items():
        if "error" in r:
            rows.append(f"| {prog} | {r['error']} | | | | | |")
            continue
        ratio = f"{r['env_steps_per_s'] / base:.2f}x" if base else "-"
        comp = f"{r['compile_s']:.1f}" if prog.startswith("timerl") else "(in 1st iter)"
        rows.append(
            f"| {prog} | {comp} | {r['first_iter_s']:.2f} | {r['median_iter_s']:.3f} | "
            f"{r['env_steps_per_s']:,.0f} | {ratio} | {r['peak_rss_mb']:,.0f} |"
        )
    return "\n".join(rows)


def run_table(cfg: Config, log: Any) -> dict[str, dict[str, dict]]:
    envs = ENVS if cfg.env == "both" else (cfg.env,)
    progs = [p.strip() for p in cfg.programs.split(",") if p.strip()]
    bad = [p for p in progs if p not in ALL_PROGRAMS]
    if bad:
        raise SystemExit(f"unknown programs {bad}; valid: {', '.join(ALL_PROGRAMS)}")
    out: dict[str, dict[str, dict]] = {}
    for env in envs:
        out[env] = {}
        for prog in progs:
            la = os.getloadavg()[0]
            print(f"  running {prog} on {env} (load {la:.2f}) ...", flush=True)
            out[env][prog] = spawn(cfg, prog, env, log)
            out[env][prog]["loadavg_start"] = la
        print(table(cfg, env, out[env]), flush=True)
    return out


SWEEP_AXES: dict[str, tuple[str, list[int]]] = {
    "episode length": ("num_steps", [32, 64, 128]),
    "hidden size": ("hidden", [32, 64, 128]),
    "layers": ("layers", [1, 2, 3]),
    "envs": ("num_envs", [16, 64, 256]),
}
SWEEP_BASE = {"num_envs": 64, "num_steps": 64, "hidden": 64, "layers": 2}


def plot_sweep(res: dict[str, dict[str, list]], env: str, png: Path) -> None:
    """One panel per axis of ``res`` (axis -> program -> env steps/s per value; a shorter list
    is a partial run), log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SWEEP_AXES), figsize=(4.2 * len(SWEEP_AXES), 3.6))
    for ax, (axis, (field, values)) in zip(axes, SWEEP_AXES.items(), strict=True):
        for p, ys in res.get(axis, {}).items():
            if ys:
                ax.plot(values[-len(ys) :], ys, marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"{axis} ({field})")
        ax.set_title(axis if axis in res else f"{axis} (not run)")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("env steps / s")
    axes[0].legend(fontsize=8)
    base = ", ".join(f"{k}={v}" for k, v in SWEEP_BASE.items())
    fig.suptitle(f"PPO on {env} CartPole, 1 thread; base: {base} (each panel varies one)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def run_sweep(cfg: Config, log: Any, out_dir: Path) -> dict:
    """Each axis of ``SWEEP_AXES`` in turn from ``SWEEP_BASE``; the PNG and JSON are
    rewritten after every point, so a stopped sweep still leaves what it measured."""
    env = "gymnax" if cfg.env == "both" else cfg.env
    progs = [p.strip() for p in cfg.sweep_programs.split(",") if p.strip()]
    res: dict[str, dict[str, list]] = {}
    png = out_dir / "sweep.png"
    seen: dict[tuple, float] = {}  # the base point is on every axis: measure it once
    for axis, (field, values) in SWEEP_AXES.items():
        res[axis] = {p: [] for p in progs}
        for v in values[-cfg.sweep_points :]:
            c = replace(cfg, **{**SWEEP_BASE, field: v}, programs=",".join(progs), env=env)
            for p in progs:
                key = (p, c.num_envs, c.num_steps, c.hidden, c.layers)
                if key not in seen:
                    print(f"  sweep {axis}={v}: {p} on {env} (load {os.getloadavg()[0]:.2f})", flush=True)
                    seen[key] = spawn(c, p, env, log).get("env_steps_per_s", float("nan"))
                res[axis][p].append(seen[key])
            plot_sweep(res, env, png)
            (out_dir / "sweep.json").write_text(json.dumps({"config": asdict(cfg), "results": res}, indent=1))
    print(f"sweep plot: {png}")
    return res


def main() -> None:
    cfg = parse_args()
    if cfg.child:
        run_child(cfg)
        return
    out_dir = ROOT / cfg.out
    out_dir.mkdir(parents=True, exist_ok=True)
    print(
        f"ppo_side_by_side: every program in its own process, OMP_NUM_THREADS=1 and "
        f"torch.set_num_threads(1); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs",
        flush=True,
    )
    with open(out_dir / "log.txt", "a") as log:
        log.write(f"\n##### {time.strftime('%Y-%m-%d %H:%M:%S')} {asdict(cfg)}\n")
        if cfg.sweep:
            res: Any = run_sweep(cfg, log, out_dir)
            name = "sweep.json"
        else:
            res = run_table(cfg, log)
            name = f"table_{cfg.num_envs}x{cfg.num_steps}.json"
    (out_dir / name).write_text(json.dumps({"config": asdict(cfg), "results": res}, indent=1))
    print(f"load average at the end {os.getloadavg()[0]:.2f}; results: {out_dir / name}")


if __name__ == "__main__":
    main()

"""Many agents in one program (issue 34): PPO on gymnax CartPole with CleanRL's settings
(4 envs x 128 steps, 4 epochs x 4 minibatches, 64-64 tanh, GAE, clip 0.2, entropy 0.01,
gradient norm 0.5, Adam 2.5e-4 annealed) for K agents at once.

Programs, each in its own subprocess, pinned to the same core (``--cores``) with one thread
(``OMP_NUM_THREADS=1``, single-threaded XLA):

* ``timerl-jax`` / ``timerl-torch``: ``examples/ppo.py``'s ``build_fixed`` with
  ``--num-seeds K`` (one program, agents along a dim ``s``);
* ``jit-vmap``: a PPO whose whole iteration is one ``jax.jit`` call, ``jax.vmap``-ed over
  the K seeds (the PureJaxRL way to train many agents), written here.

Reported per program and K: the median seconds per iteration of ``--iterations`` iterations
after ``--warmup`` (timerl: between the sinks of consecutive iterations; the jitted PPO: one
call, synchronised), the time relative to one agent, and timerl-jax against the vmapped
single-jit PPO.

    python benchmarks/many_agents.py                          # K = 1, 4, 16, 64
    python benchmarks/many_agents.py --agents 16 --programs timerl-jax,jit-vmap
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ("timerl-jax", "timerl-torch", "jit-vmap")
NUM_ENVS, NUM_STEPS, EPOCHS, MINIBATCHES = 4, 128, 4, 4
LR, GAMMA, LAM, CLIP, ENT, VF, MAX_NORM = 2.5e-4, 0.99, 0.95, 0.2, 0.01, 0.5, 0.5


def run_timerl(backend: str, agents: int, warmup: int, iterations: int, seed: int) -> list[float]:
    """Seconds per iteration of ``examples/ppo.py``'s program with ``agents`` agents."""
    sys.path.insert(0, str(ROOT / "examples"))
    import ppo

    args = ppo.Args(
        env_id="gymnax.CartPole-v1",
        backend=backend,
        num_envs=NUM_ENVS,
        num_steps=NUM_STEPS,
        iterations=warmup + iterations,
        lr=LR,
        update_epochs=EPOCHS,
        num_minibatches=MINIBATCHES,
        ent_coef=ENT,
        max_grad_norm=MAX_NORM,
        adam_eps=1e-5,
        num_seeds=agents,
        seed=seed,
        quiet=True,
    )
    logged: dict[int, int] = {}
    done_at: dict[int, float] = {}

    def log_fn(v: Any, pt: dict[str, int]) -> None:  # an iteration ends when its last agent logs
        it = pt["i"]
        logged[it] = logged.get(it, 0) + 1
        if logged[it] == agents:
            done_at[it] = time.perf_counter()

    ex = ppo.build_fixed(args, log_fn)
    t1 = time.perf_counter()
    ex.execute()
    marks = [t1] + [done_at[k] for k in range(args.iterations)]
    return [b - a for a, b in zip(marks, marks[1:], strict=False)]


def run_jit_vmap(agents: int, warmup: int, iterations: int, seed: int) -> list[float]:
    """Seconds per call of one jitted PPO iteration vmapped over ``agents`` seeds."""
    import gymnax
    import jax
    import jax.numpy as jnp
    import numpy as np

    env, env_params = gymnax.make("CartPole-v1")
    B, T, M, E = NUM_ENVS, NUM_STEPS, MINIBATCHES, EPOCHS
    n_batch, total = B * T, warmup + iterations
    mb = n_batch // M
    ortho = jax.nn.initializers.orthogonal

    def init_net(key: Any, n_out: int, gain: float) -> list[tuple[Any, Any]]:
        k1, k2, k3 = jax.random.split(key, 3)
        return [
            (ortho(np.sqrt(2.0))(k1, (4, 64)), jnp.zeros(64)),
            (ortho(np.sqrt(2.0))(k2, (64, 64)), jnp.zeros(64)),
            (ortho(gain)(k3, (64, n_out)), jnp.zeros(n_out)),
        ]

    def forward(layers: list[tuple[Any, Any]], x: Any) -> Any:
        for w, b in layers[:-1]:
            x = jnp.tanh(x @ w + b)
        w, b = layers[-1]
        return x @ w + b

    def policy(params: dict, obs: Any) -> tuple[Any, Any]:
        return jax.nn.log_softmax(forward(params["pi"], obs)), forward(params["v"], obs)[..., 0]

    def adam(params: Any, grads: Any, st: tuple, lr: Any) -> tuple[Any, tuple]:
        norm = jnp.sqrt(sum((g * g).sum() for g in jax.tree_util.tree_leaves(grads)))
        grads = jax.tree_util.tree_map(lambda g: g * jnp.minimum(1.0, MAX_NORM / (norm + 1e-6)), grads)
        m, v, n = st
        n = n + 1
        m = jax.tree_util.tree_map(lambda m_, g: 0.9 * m_ + 0.1 * g, m, grads)
        v = jax.tree_util.tree_map(lambda v_, g: 0.999 * v_ + 0.001 * g * g, v, grads)
        c1, c2 = 1.0 - 0.9**n, 1.0 - 0.999**n
        params = jax.tree_util.tree_map(
            lambda p, m_, v_: p - lr * (m_ / c1) / (jnp.sqrt(v_ / c2) + 1e-5), params, m, v
        )
        return params, (m, v, n)

    def loss_fn(p: dict, o: Any, a: Any, lp: Any, v_old: Any, ad: Any, rt: Any) -> Any:
        logits, v = policy(p, o)
        new_lp = jnp.take_along_axis(logits, a[:, None], axis=1)[:, 0]
        ratio = jnp.exp(new_lp - lp)
        ad = (ad - ad.mean()) / (ad.std() + 1e-8)
        pg = jnp.maximum(-ad * ratio, -ad * jnp.clip(ratio, 1 - CLIP, 1 + CLIP)).mean()
        v_clip = v_old + jnp.clip(v - v_old, -CLIP, CLIP)
        v_loss = 0.5 * jnp.maximum((v - rt) ** 2, (v_clip - rt) ** 2).mean()
        ent = -(jnp.exp(logits) * logits).sum(-1).mean()
        return pg + VF * v_loss - ENT * ent

    def init(key: Any) -> tuple:
        k_pi, k_v, k_env, key = jax.random.split(key, 4)
        params = {"pi": init_net(k_pi, 2, 0.01), "v": init_net(k_v, 1, 1.0)}
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        obs, st = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_env, B), env_params)
        return params, (zeros, zeros, jnp.zeros((), jnp.int32)), st, obs, key

    def iteration(params: dict, opt: tuple, env_state: Any, obs: Any, key: Any, lr: Any) -> tuple:
        def step(c: tuple, _: Any) -> tuple:
            st, o, k = c
            k, k_a, k_e = jax.random.split(k, 3)
            logits, v = policy(params, o)
            a = jax.random.categorical(k_a, logits)
            lp = jnp.take_along_axis(logits, a[:, None], axis=1)[:, 0]
            o2, st, r, term, trunc, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(k_e, B), st, a, env_params
            )
            return (st, o2, k), (o, a, lp, v, r, (term | trunc).astype(jnp.float32))

        (env_state, obs, key), traj = jax.lax.scan(step, (env_state, obs, key), None, length=T)
        o, a, lp, val, rew, done = traj
        _, v_last = policy(params, obs)

        def gae_step(carry: tuple, x: tuple) -> tuple:
            run, v_next = carry
            r, d, v = x
            nd = 1.0 - d
            run = r + GAMMA * nd * v_next - v + GAMMA * LAM * nd * run
            return (run, v), run

        _, adv = jax.lax.scan(gae_step, (jnp.zeros(B), v_last), (rew, done, val), reverse=True)
        flat = [x.reshape((n_batch,) + x.shape[2:]) for x in (o, a, lp, val, adv, adv + val)]

        def epoch(carry: tuple, k: Any) -> tuple:
            def mb_step(c: tuple, idx: Any) -> tuple:
                p, st = c
                loss, g = jax.value_and_grad(loss_fn)(p, *(x[idx] for x in flat))
                p, st = adam(p, g, st, lr)
                return (p, st), loss

            perm = jax.random.permutation(k, n_batch).reshape(M, mb)
            return jax.lax.scan(mb_step, carry, perm)

        key, k_perm = jax.random.split(key)
        (params, opt), losses = jax.lax.scan(epoch, (params, opt), jax.random.split(k_perm, E))
        return params, opt, env_state, obs, key, losses[-1, -1]

    state = jax.vmap(init)(jax.random.split(jax.random.PRNGKey(seed), agents))
    step_all = jax.jit(jax.vmap(iteration, in_axes=(0, 0, 0, 0, 0, None)))
    out = []
    for it in range(total):
        t0 = time.perf_counter()
        lr = jnp.float32(LR * (1.0 - it / total))
        *state, loss = step_all(*state, lr)
        loss.block_until_ready()
        out.append(time.perf_counter() - t0)
    return out


def child(argv: list[str]) -> None:
    prog, agents, warmup, iterations, seed = argv[0], *map(int, argv[1:5])
    if prog == "timerl-torch":
        import torch

        torch.set_num_threads(1)
        got = run_timerl("torch", agents, warmup, iterations, seed)
    elif prog == "timerl-jax":
        got = run_timerl("jax", agents, warmup, iterations, seed)
    else:
        got = run_jit_vmap(agents, warmup, iterations, seed)
    print("RESULT " + json.dumps(got), flush=True)


def spawn(prog: str, agents: int, a: argparse.Namespace) -> float | str:
    """The median seconds per iteration of one program in its own pinned process."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env["XLA_FLAGS"] = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    argv = ["taskset", "-c", a.cores, sys.executable, __file__, "--child", prog]
    argv += [str(x) for x in (agents, a.warmup, a.iterations, a.seed)]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=a.timeout)
    except subprocess.TimeoutExpired:
        return f"timed out after {a.timeout} s"
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            times = json.loads(line[len("RESULT ") :])
            return statistics.median(times[a.warmup :])
    return f"rc={out.returncode}: {(out.stderr.strip().splitlines() or ['?'])[-1][:160]}"


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default="1,4,16,64", help="agent counts, comma-separated")
    p.add_argument("--programs", default=",".join(PROGRAMS))
    p.add_argument("--warmup", type=int, default=30, help="untimed iterations (compiles included)")
    p.add_argument("--iterations", type=int, default=60, help="timed iterations")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cores", default="0", help="taskset core list for every program")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per program")
    a = p.parse_args()
    counts = [int(x) for x in a.agents.split(",")]
    progs = [x for x in a.programs.split(",") if x]
    res: dict[str, dict[int, Any]] = {prog: {} for prog in progs}
    for k in counts:  # one agent count at a time, the programs in turn
        for prog in progs:
            res[prog][k] = spawn(prog, k, a)
            print(f"{prog:13} {k:3d} agents: {res[prog][k]}", flush=True)
    print(f"\nseconds per iteration (median of {a.iterations} after {a.warmup}), cores {a.cores}, one thread")
    print(f"{'agents':>6} " + " ".join(f"{prog:>22}" for prog in progs) + "   timerl-jax / jit-vmap")
    for k in counts:
        cells = []
        for prog in progs:
            v, one = res[prog][k], res[prog].get(1)
            rel = f" ({v / one:4.1f}x)" if isinstance(v, float) and isinstance(one, float) else ""
            cells.append(f"{v:9.4f}{rel:>8}" if isinstance(v, float) else f"{str(v)[:22]:>22}")
        tj, jv = res.get("timerl-jax", {}).get(k), res.get("jit-vmap", {}).get(k)
        ratio = f"{tj / jv:8.2f}" if isinstance(tj, float) and isinstance(jv, float) else ""
        print(f"{k:6d} " + " ".join(f"{c:>22}" for c in cells) + f"   {ratio}")


if __name__ == "__main__":
    main()

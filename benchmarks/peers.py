"""PPO peers: timerl (JAX and Torch backends) beside the PPOs people use, on one workload.

Peers (``--peers``, comma-separated):

- ``timerl-jax``, ``timerl-torch``: ``examples/ppo.py``'s ``build_fixed`` (all passes on);
- ``torch-eager``: PPO in the single-file CleanRL style, eager PyTorch;
- ``jax-jit``: PPO in the PureJaxRL style, the whole iteration one ``jax.jit`` call (rollout,
  GAE and updates as ``lax.scan``s) on gymnax's JAX CartPole;
- ``sb3``: Stable-Baselines3's ``PPO`` (2.9.2) on a ``DummyVecEnv`` of gymnasium CartPoles;
- ``rllib``: RLlib's ``PPO`` (ray 2.60.0, new API stack, sampling and learning in the driver).

The four in-repo peers run with timerl's interpreter (their code is
``benchmarks/ppo_side_by_side.py``'s runners). SB3 and RLlib each run from their own
virtualenv under ``--cache-dir`` (RLlib pins ``gymnasium==1.2.2``, which timerl's environment
cannot take), made with ``python -m venv`` and ``pip install`` of pinned versions on first use
and reused afterwards; a peer whose install or run fails is a table row with its error.

Same workload for all: CartPole-v1, ``--num-envs`` B envs x ``--num-steps`` T steps per
iteration, actor and critic separate 2x64 tanh MLPs, GAE(0.99, 0.95), one epoch of clipped-PPO
updates (clip 0.2, value coefficient 0.5, entropy 0.01, Adam lr 2.5e-4) over
``--num-minibatches`` minibatches. Every peer is its own subprocess, pinned with
``taskset -c --cores``, with the same environment: ``OMP/MKL/OPENBLAS_NUM_THREADS``,
``torch.set_num_threads`` and XLA's intra-op threads all ``--threads``, glibc malloc with no
``LD_PRELOAD`` or ``MALLOC_*`` settings. What SB3 and RLlib cannot be made to match is in
``MISMATCHES`` (printed under the table).

    python benchmarks/peers.py --num-envs 512 --num-steps 250 --iterations 6
    python benchmarks/peers.py --peers timerl-jax,jax-jit,sb3 --cores 0 --threads 1 --json /tmp/peers.json

Columns: *s/iter* is the median wall time of the iterations after ``--warmup``; *env steps/s*
is B x T / s/iter; *startup s* is the time from launching the process to the end of its first
iteration, minus one steady iteration (imports, env creation, ray start, compiling); *compile
s* is the peer's own compile figure (timerl: trace -> passes -> schedule -> AST; jax-jit: its
first iteration minus a steady one); *peak RSS MB* is the largest sum of the resident sets of
the peer's process tree, sampled every 0.2 s from /proc (and at least the ``wait4`` maximum).

This module imports only the standard library at the top: the SB3 and RLlib venvs run it
(``--child``) without timerl.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("peers")
IN_REPO = ("timerl-jax", "timerl-torch", "torch-eager", "jax-jit")
EXTERNAL: dict[str, list[str]] = {  # peer -> pinned requirements of its venv
    "sb3": ["stable-baselines3==2.9.2", "torch==2.13.0", "gymnasium==1.3.0"],
    "rllib": ["ray[rllib]==2.60.0", "torch==2.13.0", "gymnasium==1.2.2"],
}
ALL_PEERS = (*IN_REPO, *EXTERNAL)
ENV_OF = {  # the CartPole each peer steps
    "timerl-jax": "gymnasium NumPy vector env",
    "timerl-torch": "gymnasium NumPy vector env",
    "torch-eager": "gymnasium NumPy vector env",
    "jax-jit": "gymnax (JAX, inside the jit)",
    "sb3": "DummyVecEnv of gymnasium envs",
    "rllib": "gymnasium SyncVectorEnv",
}
MISMATCHES = {
    "timerl-jax": "an iteration is timed between consecutive rollout ends; with --timerl-env gymnax "
    "it steps gymnax's JAX CartPole",
    "timerl-torch": "as timerl-jax",
    "jax-jit": "steps a JAX CartPole (a host env cannot go inside one jit)",
    "sb3": "clips gradients (max_grad_norm=1e9: the norm is computed, never binding); normalises "
    "advantages per minibatch (= per rollout when M=1); bootstraps truncated episodes with an extra "
    "critic call; a Python CartPole per env (DummyVecEnv)",
    "rllib": "samples whole vector steps until it has B x T, a few more (env steps/s uses its own count); "
    "adds a bootstrap row per episode chunk to the train batch; constant lr; value "
    "clipping off (vf_clip_param=inf); its connector pipelines run per batch; gymnasium 1.2.2 and a "
    "Python CartPole per env (SyncVectorEnv); a local ray runtime (gcs, raylet) counts in RSS",
}


@dataclass
class Config:
    """Flags of ``benchmarks/peers.py`` (one per field; ``--help`` shows these docstrings)."""

    num_envs: int = 512
    """parallel envs (B)"""
    num_steps: int = 250
    """steps per rollout (T)"""
    iterations: int = 4
    """timed iterations (after the warm-up ones)"""
    warmup: int = 3
    """untimed iterations first (timerl-jax compiles regions during its first three
    rollout-to-rollout intervals; the jitted peers compile in their first)"""
    num_minibatches: int = 1
    """minibatches of the one update epoch (M), for every peer"""
    peers: str = ",".join(ALL_PEERS)
    """comma-separated subset of: timerl-jax, timerl-torch, torch-eager, jax-jit, sb3, rllib"""
    cores: str = "0"
    """the cores every peer is pinned to (taskset -c)"""
    threads: int = 1
    """threads of every peer: OMP/MKL/OpenBLAS, torch.set_num_threads, XLA intra-op"""
    timerl_env: str = "gym"
    """the CartPole of timerl's peers: gym (gymnasium's NumPy vector env) or gymnax (JAX)"""
    cache_dir: str = "~/.cache/timerl/peers"
    """where the SB3 and RLlib virtualenvs are made (<cache-dir>/<peer>) and reused"""
    timeout: int = 1800
    """seconds one peer may run (or install) before it is stopped and reported as such"""
    seed: int = 0
    """random seed"""
    json: str = ""
    """also write the raw results here (a JSON file)"""


# --------------------------------------------------------------------------- the child side


def _child(peer: str, spec: dict[str, Any]) -> None:
    """Run one peer in this process; print ``iter k`` after each iteration, then ``RESULT``."""
    if peer in IN_REPO:
        res = _run_in_repo(peer, spec)
    elif peer == "sb3":
        res = _run_sb3(spec)
    elif peer == "rllib":
        res = _run_rllib(spec)
    else:
        raise SystemExit(f"unknown peer {peer}")
    print("RESULT " + json.dumps(res), flush=True)


def _run_in_repo(peer: str, spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import ppo_side_by_side as sbs

    total = spec["warmup"] + spec["iterations"]
    cfg = sbs.Config(
        num_envs=spec["num_envs"],
        num_steps=spec["num_steps"],
        iterations=total,
        warmup=0,
        num_minibatches=spec["num_minibatches"],
        seed=spec["seed"],
    )
    if peer.startswith("timerl") or peer == "torch-eager":
        import torch

        torch.set_num_threads(spec["threads"])
    if peer == "timerl-jax":
        r = sbs.run_timerl(cfg, spec["timerl_env"], "jax", True)
    elif peer == "timerl-torch":
        r = sbs.run_timerl(cfg, spec["timerl_env"], "torch", True)
    elif peer == "torch-eager":
        r = sbs.run_torch_eager(cfg, "gym")
    else:
        r = sbs.run_jax_jit(cfg, "gymnax")
    out = {"iter_s": r["iter_s"]}
    if peer.startswith("timerl"):
        out["compile_s"] = r["compile_s"]
    return out


def _run_sb3(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(spec["threads"])
    B, T, M = spec["num_envs"], spec["num_steps"], spec["num_minibatches"]
    total = spec["warmup"] + spec["iterations"]
    starts: list[float] = []

    class Marks(BaseCallback):
        """An iteration is one rollout and one update: from a rollout's start to the next's."""

        def _on_rollout_start(self) -> None:
            starts.append(time.perf_counter())
            if len(starts) > 1:
                print(f"iter {len(starts) - 2} {starts[-1] - starts[-2]:.3f}s", flush=True)

        def _on_step(self) -> bool:
            return True

    envs = make_vec_env("CartPole-v1", n_envs=B, seed=spec["seed"])  # DummyVecEnv
    model = PPO(
        "MlpPolicy",
        envs,
        learning_rate=lambda frac: 2.5e-4 * frac,  # linear annealing, as the others
        n_steps=T,
        batch_size=B * T // M,
        n_epochs=1,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=1e9,
        policy_kwargs={"net_arch": {"pi": [64, 64], "vf": [64, 64]}, "activation_fn": torch.nn.Tanh},
        device="cpu",
        seed=spec["seed"],
        verbose=0,
    )
    model.learn(total_timesteps=total * B * T, callback=Marks())
    end = time.perf_counter()
    print(f"iter {len(starts) - 1} {end - starts[-1]:.3f}s", flush=True)
    marks = [*starts, end]
    return {"iter_s": [b - a for a, b in zip(marks, marks[1:], strict=False)]}


def _run_rllib(spec: dict[str, Any]) -> dict[str, Any]:
    import ray
    import torch
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    torch.set_num_threads(spec["threads"])
    B, T, M = spec["num_envs"], spec["num_steps"], spec["num_minibatches"]
    total = spec["warmup"] + spec["iterations"]
    ray.init(num_cpus=max(1, len(os.sched_getaffinity(0))), include_dashboard=False, log_to_driver=False)
    config = (
        PPOConfig()
        .environment("CartPole-v1")
        .framework("torch")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=B, rollout_fragment_length=T)
        .learners(num_learners=0)
        .training(
            train_batch_size_per_learner=B * T,
            minibatch_size=B * T // M,
            num_epochs=1,
            gamma=0.99,
            lambda_=0.95,
            clip_param=0.2,
            vf_clip_param=float("inf"),
            vf_loss_coeff=0.5,
            entropy_coeff=0.01,
            lr=2.5e-4,
            grad_clip=None,
            use_kl_loss=False,
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[64, 64], fcnet_activation="tanh", vf_share_layers=False
            )
        )
        .debugging(seed=spec["seed"])
    )
    algo = config.build_algo()
    iter_s = []
    rows, sampled = [], []
    for k in range(total):
        t0 = time.perf_counter()
        res = algo.train()
        iter_s.append(time.perf_counter() - t0)
        rows.append(_find(res, "num_env_steps_trained_lifetime"))
        sampled.append(_find(res, "num_env_steps_sampled_lifetime"))
        print(f"iter {k} {iter_s[-1]:.3f}s", flush=True)
    algo.stop()
    ray.shutdown()
    per_iter = [b - a for a, b in zip([0, *sampled], sampled, strict=False)] if None not in sampled else None
    return {"iter_s": iter_s, "env_steps_per_iter": per_iter, "rows_trained_lifetime": rows}


def _find(d: Any, key: str) -> Any:
    """The first value under ``key`` anywhere in nested dicts (RLlib's result layout moves)."""
    if isinstance(d, dict):
        if key in d:
            return d[key]
        for v in d.values():
            f = _find(v, key)
            if f is not None:
                return f
    return None


# --------------------------------------------------------------------------- the parent side


def peer_env(cfg: Config) -> dict[str, str]:
    """The environment every peer gets: the same threads, allocator and JAX settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"}
    n = str(cfg.threads)
    env.update(
        OMP_NUM_THREADS=n,
        MKL_NUM_THREADS=n,
        OPENBLAS_NUM_THREADS=n,
        XLA_FLAGS=f"--xla_cpu_multi_thread_eigen={'true' if cfg.threads > 1 else 'false'} "
        f"intra_op_parallelism_threads={n}",
        JAX_PLATFORMS="cpu",
        PYTHONPATH=str(ROOT),
        RAY_USAGE_STATS_ENABLED="0",
    )
    return env


def ensure_venv(peer: str, cache_dir: Path, timeout: int) -> Path:
    """The python of ``peer``'s virtualenv, made (``python -m venv`` + ``pip install`` of
    ``EXTERNAL[peer]``) unless one with the same requirements is there; raises on failure."""
    d = cache_dir / peer
    py = d / "bin" / "python"
    stamp = d / "peers-requirements.txt"
    want = "\n".join(EXTERNAL[peer])
    if py.exists() and stamp.exists() and stamp.read_text() == want:
        return py
    log.info("making the %s virtualenv in %s (once; a few minutes)", peer, d)
    d.parent.mkdir(parents=True, exist_ok=True)
    cmds = [
        [sys.executable, "-m", "venv", "--clear", str(d)],
        [str(py), "-m", "pip", "install", *EXTERNAL[peer]],
    ]
    with open(cache_dir / f"{peer}.install.log", "w") as f:
        for c in cmds:
            r = subprocess.run(c, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            if r.returncode != 0:
                raise RuntimeError(f"`{' '.join(c[-3:])}` failed (rc={r.returncode}); see {f.name}")
    stamp.write_text(want)
    return py


def _tree_rss_mb(root: int) -> float:
    """The summed VmRSS of ``root`` and its descendants, from /proc."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                st = f.read()
            ppid = int(st[st.rindex(")") + 2 :].split()[1])
            with open(f"/proc/{p}/statm") as f:
                rss[int(p)] = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(p))
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo += kids.get(p, [])
    return total * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_peer(cfg: Config, peer: str, python: str) -> dict[str, Any]:
    """Run one peer pinned to ``cfg.cores``; its timings, startup, compile and peak RSS."""
    spec = {k: getattr(cfg, k) for k in ("num_envs", "num_steps", "iterations", "warmup", "num_minibatches")}
    spec.update(threads=cfg.threads, timerl_env=cfg.timerl_env, seed=cfg.seed)
    argv = [
        "taskset",
        "-c",
        cfg.cores,
        python,
        str(Path(__file__).resolve()),
        "--child",
        peer,
        json.dumps(spec),
    ]
    t_launch = time.perf_counter()
    proc = subprocess.Popen(  # its own process group: a timeout stops the whole tree (ray's too)
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=peer_env(cfg),
        cwd=ROOT,
        start_new_session=True,
    )
    peak = [0.0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            peak[0] = max(peak[0], _tree_rss_mb(proc.pid))

    err: list[str] = []
    marks: dict[str, Any] = {"first_done": math.nan, "result": None}

    def read() -> None:
        for line in proc.stdout or []:
            if line.startswith("iter ") and math.isnan(marks["first_done"]):
                marks["first_done"] = time.perf_counter() - t_launch
            elif line.startswith("RESULT "):
                marks["result"] = json.loads(line[len("RESULT ") :])

    def kill_tree() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    readers = [threading.Thread(target=read, daemon=True)]
    readers.append(threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True))
    for t in [threading.Thread(target=sample, daemon=True), *readers]:
        t.start()
    timer = threading.Timer(cfg.timeout, kill_tree)
    timer.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    timer.cancel()
    stop.set()
    kill_tree()  # whatever the peer left running (none, normally)
    for t in readers:
        t.join(timeout=10)
    first_done, result = marks["first_done"], marks["result"]
    wall = time.perf_counter() - t_launch
    if result is None:
        tail = "".join(err).strip().splitlines() or [f"rc={proc.returncode}"]
        why = f"timed out after {cfg.timeout}s" if wall >= cfg.timeout else tail[-1][:240]
        return {"error": why, "rc": proc.returncode, "stderr_tail": "".join(err)[-3000:]}
    iters = result["iter_s"]
    steady = statistics.median(iters[cfg.warmup :] or iters)
    steps = cfg.num_envs * cfg.num_steps  # RLlib counts its own: it may sample a few more
    if result.get("env_steps_per_iter"):
        steps = statistics.median(result["env_steps_per_iter"][cfg.warmup :] or result["env_steps_per_iter"])
    own = result.get("compile_s")
    if own is None and peer == "jax-jit":
        own = iters[0] - steady
    return {
        **result,
        "median_iter_s": steady,
        "env_steps_per_s": steps / steady,
        "startup_s": first_done - steady,
        "compile_s": own,
        "peak_rss_mb": max(peak[0], usage.ru_maxrss / 1024.0),
        "wall_s": wall,
    }


def table(cfg: Config, results: dict[str, dict[str, Any]]) -> str:
    """The results as one plain-text table (aligned columns), the mismatches under it."""
    head = ["peer", "CartPole", "s/iter", "env steps/s", "startup s", "compile s", "peak RSS MB"]
    rows = [head]
    for peer, r in results.items():
        if "error" in r:
            rows.append([peer, ENV_OF[peer], f"FAILED: {r['error']}"])
            continue
        comp = "-" if r.get("compile_s") is None else f"{r['compile_s']:.1f}"
        rows.append(
            [
                peer,
                ENV_OF[peer],
                f"{r['median_iter_s']:.3f}",
                f"{r['env_steps_per_s']:,.0f}",
                f"{r['startup_s']:.1f}",
                comp,
                f"{r['peak_rss_mb']:,.0f}",
            ]
        )
    widths = [max(len(r[k]) for r in rows if len(r) == len(head)) for k in range(len(head))]
    lines = [
        f"PPO on CartPole-v1: {cfg.num_envs} envs x {cfg.num_steps} steps, 2x64 tanh, GAE(0.99, 0.95), "
        f"1 epoch, {cfg.num_minibatches} minibatch(es); {cfg.warmup} warm-up + {cfg.iterations} timed "
        f"iterations; taskset -c {cfg.cores}, {cfg.threads} thread(s)"
    ]
    for r in rows:
        if len(r) == len(head):
            lines.append(
                "  ".join(
                    c.rjust(w) if k >= 2 else c.ljust(w)
                    for k, (c, w) in enumerate(zip(r, widths, strict=True))
                )
            )
        else:
            lines.append("  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2]]))
    lines.append("not matched:")
    lines += [f"  {p}: {MISMATCHES[p]}" for p in results if p in MISMATCHES]
    return "\n".join(lines)


def run(cfg: Config) -> dict[str, dict[str, Any]]:
    """Every peer of ``cfg.peers`` in turn (making the venvs it needs); the results by peer."""
    peers = [p.strip() for p in cfg.peers.split(",") if p.strip()]
    bad = [p for p in peers if p not in ALL_PEERS]
    if bad:
        raise SystemExit(f"unknown peers {bad}; valid: {', '.join(ALL_PEERS)}")
    cache = Path(cfg.cache_dir).expanduser()
    out: dict[str, dict[str, Any]] = {}
    for peer in peers:
        la = os.getloadavg()[0]
        log.info("running %s (load average %.2f)", peer, la)
        try:
            py = str(ensure_venv(peer, cache, cfg.timeout)) if peer in EXTERNAL else sys.executable
            out[peer] = run_peer(cfg, peer, py)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            out[peer] = {"error": f"{type(exc).__name__}: {exc}"[:240]}
        out[peer]["loadavg_start"] = la
    return out


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    sys.path.insert(0, str(ROOT))
    import timerl as trl

    cfg = trl.run.parse_args(
        Config, description="PPO peers: timerl beside CleanRL, PureJaxRL, SB3, RLlib", argv=argv
    )
    trl.run.setup_logging()
    log.setLevel(logging.INFO)
    results = run(cfg)
    print(table(cfg, results))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if cfg.json:
        Path(cfg.json).write_text(json.dumps({"config": asdict(cfg), "results": results}, indent=1))
    return results


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        _child(sys.argv[2], json.loads(sys.argv[3]))
    else:
        main()

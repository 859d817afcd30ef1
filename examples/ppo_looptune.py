# LoopTune (Grubisic et al.) with PPO as a timerl program: the agent learns to schedule
# matmul loop nests (cursor / swap / split actions, reward = GFLOPS gain / machine peak,
# measured by compiling the nest with TVM and timing it). Trains on the train split,
# saves the policy, then tunes unseen test problems greedily and prints the table of
# tuned vs untuned GFLOPS (and NumPy's) with the geomean speedup.
from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import timerl as trl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import ppo  # noqa: E402


@dataclass
class Args(ppo.Args):
    env_id: str = "looptune.mm"
    """the LoopTune dataset (looptune.mm: matmuls with m, n, k in 64..256 step 16)"""
    num_envs: int = 16
    """parallel environments (the batch dim b): one problem each per episode"""
    iterations: int = 80
    """training iterations; each runs one 10-action episode per env"""
    lr: float = 3e-3
    """Adam learning rate (annealed linearly to 0)"""
    gamma: float = 0.9
    """discount factor (episodes are 10 actions)"""
    ent_coef: float = 0.01
    """entropy bonus coefficient"""
    hidden: int = 128
    """hidden units per layer (two layers)"""
    train_problems: int = 24
    """train on this many problems of the train split (0: all 1757); fewer problems, more
    schedule-cache hits, so training fits in minutes"""
    eval_problems: int = 16
    """test problems to tune after training (0: all 440)"""
    reward: str = "best"
    """training reward. best: gain over the best schedule so far (the return is the best
    schedule's gain; tuning keeps the best schedule of the greedy rollout); step: the
    paper's per-action (GFLOPS(S') - GFLOPS(S)) / peak; final: the same return paid at the
    last action (one measurement per episode; tuning keeps the last schedule)"""
    measurer: str = "tvm"
    """tvm: compile and time (the real reward); analytic: a cost model for tests only"""
    searches: str = ""
    """comma-separated search baselines to run on the test problems too (e.g. greedy1,random)"""
    search_time_limit: float = 60.0
    """seconds per search and problem"""
    out_dir: str = "runs/ppo_looptune"
    """where the policy checkpoint, results (CSV/JSON) and plots go"""


def parse_args(defaults: Args | None = None) -> Args:
    return _common.parse_args(Args, defaults, "LoopTune: PPO over loop-nest schedules, as a timerl program")


def _subset(problems: list, n: int, seed: int) -> list:
    if n <= 0 or n >= len(problems):
        return list(problems)
    idx = np.random.default_rng(seed).choice(len(problems), n, replace=False)
    return [problems[int(k)] for k in sorted(idx)]


def make_env(args: Args, B, split: str, problems: list, reward: str):
    """The LoopTune env of ``args`` over ``problems`` (``B`` envs along the batch dim)."""
    return trl.env.make(
        args.env_id,
        num_envs=B,
        seed=args.seed,
        split=split,
        problems=problems,
        measurer=args.measurer,
        reward=reward,
    )


def latest_weights(ckpt_dir: str) -> dict[str, np.ndarray]:
    """The network's parameters (``dnn.*``) at their latest point in the latest checkpoint."""
    from timerl.runtime.checkpoint import read_values

    return {
        name: by_point[max(by_point)]
        for name, by_point in read_values(ckpt_dir).items()
        if name.startswith("dnn.") and ".adam_" not in name
    }


def tune_with_policy(args: Args, weights: dict[str, np.ndarray], problems: list) -> dict[str, dict]:
    """Greedy rollouts of the trained policy on ``problems`` (an RT program of its own):
    per problem, the actions taken, the schedule kept (the best one of the rollout with
    ``reward="best"``, else the last) and the seconds per problem (policy inference plus
    compiling and timing the schedules measured)."""
    B = min(args.num_envs, len(problems))
    iters = math.ceil(len(problems) / B)
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, Bs), (i, I), (t, T)):
        env = make_env(args, Bs, "test", problems, reward="best" if args.reward == "best" else "final")
        dnn = (
            trl.DNNBuilder(seed=args.seed).from_env(env, hidden=[args.hidden] * 2, critic=True).build(weights)
        )
        o = trl.like(env.obs_space, domain=(b, i, t), name="obs")
        o[b, i, 0] = env.reset(domain=(b, i))
        # greedy over the actions that change the nest: an argmax on a no-op would repeat
        # it for the rest of the episode (the state, hence the choice, stays the same)
        valid = env.action_mask(o)
        a = (dnn.forward(o) + (valid - 1.0) * 1e9).argmax(-1)
        o[b, i, t + 1], _, d = env.step(a)
    ex = ctx.compile({Bs: B, I: iters, T: d}, backend=args.backend, seed=args.seed)
    t0 = time.perf_counter()
    ex.execute()
    per_problem = (time.perf_counter() - t0) / (B * iters)
    out = {}
    for rec in env.history:
        if rec.problem.name not in out:
            kept = rec.best_key if args.reward == "best" else rec.final_key
            out[rec.problem.name] = {"actions": list(rec.actions), "state": kept, "seconds": per_problem}
    return out


def main(args: Args) -> dict:
    logging.basicConfig(level=logging.WARNING)
    from timerl.envs.looptune import dataset, evaluate
    from timerl.envs.looptune.measure import make_measurer

    name = args.env_id.split(".", 1)[1]
    train, test = dataset.split(name, seed=0)
    train = _subset(train, args.train_problems, args.seed)
    test = _subset(test, args.eval_problems, args.seed + 1)
    out = Path(args.out_dir)
    ckpt = out / "checkpoints"
    if args.checkpoint_every <= 0:
        args.checkpoint_every = args.iterations  # the final policy
    args.checkpoint_dir = str(ckpt)
    print(
        f"LoopTune {args.env_id}: training PPO on {len(train)} train problems, {args.num_envs} envs x "
        f"{args.iterations} iterations ({args.measurer} measurer, {args.backend} backend)",
        flush=True,
    )

    def env_fn(a: Args, B):
        return make_env(a, B, "train", train, reward=a.reward)

    t0 = time.perf_counter()
    means = ppo.main(args, env_fn)
    train_s = time.perf_counter() - t0
    weights = latest_weights(str(ckpt))
    print(f"trained in {train_s:.0f}s; policy saved in {ckpt}; tuning {len(test)} test problems", flush=True)

    results = tune_with_policy(args, weights, test)
    out.mkdir(parents=True, exist_ok=True)
    (out / "policy_results.json").write_text(json.dumps(results, indent=1))
    measurer = make_measurer(args.measurer)
    tuners = {"ppo": evaluate.policy_tuner(results, measurer)}
    if args.searches:
        names = [s for s in args.searches.split(",") if s]
        tuners.update(
            evaluate.search_tuners(
                names, lambda: make_measurer(args.measurer), time_limit=args.search_time_limit
            )
        )
    report = evaluate.evaluate(test, tuners, measurer, meta={"args": asdict(args), "train_seconds": train_s})
    paths = evaluate.write_report(report, out)
    print(evaluate.format_summary(report))
    print(f"training: {train_s:.0f}s, mean return per iteration {[round(m, 3) for m in means]}")
    print(f"results: {paths['results.csv']}, plots: {paths['fig8.png']}, {paths['fig9.png']}")
    return {"means": means, "report": report, "train_seconds": train_s}


if __name__ == "__main__":
    main(parse_args())

# LoopTune (Grubisic et al.) with PPO as a timerl program: the agent learns to schedule
# matmul loop nests (cursor / swap / split actions, reward = GFLOPS gain / machine peak,
# measured by compiling the nest with TVM and timing it; every update also imitates each training
# problem's best measured episode so far, --bc-coef). Trains on the train split,
# saves the policy and its learning curve, then tunes unseen test problems greedily and
# prints the table of tuned vs untuned GFLOPS (and NumPy's) with the geomean speedup.
# Every reported figure is measured again by fresh measurers (best of --remeasure, no
# disk cache), not taken from the cached measurement that picked the schedule.
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

import timerl as trl
from timerl.agents import ppo  # the PPO program over any env (examples/ppo.py trains it)


@dataclass
class Args(ppo.PPOArgs):
    env_id: str = "looptune.mm"
    """the LoopTune dataset (looptune.mm: matmuls with m, n, k in 64..256 step 16)"""
    num_envs: int = 8
    """parallel environments (the batch dim b): one problem each per episode"""
    iterations: int = 150
    """training iterations (one Adam step each); each runs one 10-action episode per env (400
    before buffer imitation, which waited 100-350 iterations for a take-off)"""
    lr: float = 3e-3
    """Adam learning rate (annealed linearly to 0)"""
    gamma: float = 0.9
    """discount factor (episodes are 10 actions)"""
    ent_coef: float = 0.03
    """entropy bonus coefficient (with 0.01, one fresh run in three settled on k-blocking, 1.5x)"""
    hidden: int = 128
    """hidden units per layer (two layers)"""
    norm_adv: bool = False
    """normalise advantages per iteration. Off here: most early rollouts find no gain, and
    normalising their zero returns turns value noise into unit-size policy steps (the
    policy drifted to repeating splits and learned nothing in fresh runs)"""
    train_problems: int = 24
    """train on this many problems of the train split (0: all 1757); fewer problems, more
    schedule-cache hits, so training fits in minutes"""
    eval_problems: int = 16
    """test problems to tune after training (0: all 440)"""
    reward: str = "log"
    """training reward. log: log(GFLOPS / best so far) when it beats the noise margin (the
    return is the log speedup of the episode's best schedule; tuning keeps that schedule);
    best: the same in GFLOPS / peak, noise included; step: the paper's per-action
    (GFLOPS(S') - GFLOPS(S)) / peak; final: that return paid at the last action (tuning
    keeps the last schedule)"""
    bc_coef: float = 1.0
    """buffer imitation (0: off): weight of the cross-entropy -log pi(a|s) on the states and
    actions of each training problem's best measured episode so far, added to every update
    (the Tiramisu agent's --bc-coef). Without it the policy learns only if random actions
    happen to find the paying 3-4 action move early enough (a lottery over seeds)"""
    demo_min_speedup: float = 1.15
    """with --bc-coef > 0: imitate a problem's best episode once it beats the untuned nest by
    this factor (above the --noise margin: a low reading of the untuned nest is no lesson)"""
    seed_demos: bool = True
    """with --bc-coef > 0: before training, rank schedules of each training problem with this
    CPU's analytic cost model (a beam search and the register tiles), measure the best four
    and imitate the fastest from the first update (``seed_demos.search_demos``); the agent's
    own episodes replace a demonstration when they measure faster"""
    noise: float = 0.1
    """reward=log: relative gains below this are timing noise and earn nothing (one
    measurement of the untuned nest can read 10-15 % low on a busy machine)"""
    measurer: str = "tvm"
    """tvm: compile and time (the real reward); analytic: a cost model for tests only"""
    searches: str = ""
    """comma-separated search baselines to run on the test problems too (e.g. greedy1,random)"""
    search_time_limit: float = 60.0
    """seconds per search and problem"""
    remeasure: int = 3
    """measure the untuned and the tuned schedules as the best of this many fresh measurers"""
    progress: bool = True
    """progress bars with the time left (tqdm) instead of one line per iteration"""
    out_dir: str = "runs/ppo_looptune"
    """where the policy checkpoint, results (CSV/JSON), plots and the training metrics
    (metrics.csv, TensorBoard events) go"""


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(Args, defaults, "LoopTune: PPO over loop-nest schedules, as a timerl program")


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
        noise=args.noise,
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
    per problem, the actions taken, the schedule kept (the last one with ``reward="final"``,
    else the best one of the rollout) and the seconds per problem (policy inference plus
    compiling and timing the schedules measured)."""
    B = min(args.num_envs, len(problems))
    iters = math.ceil(len(problems) / B)
    ctx = trl.Context(dims=("b", "i", "t"))
    with ctx as ((b, Bs), (i, I), (t, T)):
        env = make_env(args, Bs, "test", problems, reward="final" if args.reward == "final" else args.reward)
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
            kept = rec.final_key if args.reward == "final" else rec.best_key
            out[rec.problem.name] = {"actions": list(rec.actions), "state": kept, "seconds": per_problem}
    return out


def train(args: Args, problems: list) -> tuple[list[float], list[float]]:
    """PPO (``ppo.build``) on ``problems``: per iteration, the mean episode return and the
    geomean over the envs of the best schedule's speedup (as the training measurer saw it)."""
    envs = []

    def env_fn(a: Args, B):
        env = make_env(a, B, "train", problems, reward=a.reward)
        if a.seed_demos and a.bc_coef > 0 and not envs:
            from timerl.envs.looptune.seed_demos import search_demos

            t = time.perf_counter()
            demos = search_demos(problems, env.measurer, max_steps=env.episode_len, max_loops=env.max_loops)
            kept = env.seed_demonstrations(demos)
            speedups = [d.speedup for d in demos]
            print(
                f"demonstrations: {kept} of {len(problems)} training problems, "
                f"geomean {math.exp(np.mean(np.log(speedups))) if speedups else 1.0:.2f}x untuned "
                f"({time.perf_counter() - t:.0f}s)",
                flush=True,
            )
        envs.append(env)
        return env

    returns: dict[int, list[float]] = {}
    means: list[float] = []
    quiet = args.quiet or not args.progress
    run: trl.run.RunLog | None = None  # made once compiled: its bar times iterations only
    t0 = time.perf_counter()

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        it = pt["i"]
        returns.setdefault(it, []).append(float(v[0]))
        if len(returns[it]) == args.num_envs:
            means.append(float(np.mean(returns[it])))
            line = f"iter {it:4d}  mean return {means[-1]:8.3f}  time {time.perf_counter() - t0:6.1f}s"
            assert run is not None
            run.log(it, line if quiet else None, mean_return=means[-1])

    ex = ppo.build(args, log_fn, env_fn)
    run = trl.run.RunLog(args.out_dir, args.iterations, "training", quiet)
    ex.execute()
    run.close()  # metrics.csv and TensorBoard events; main plots the two-panel learning curve
    speedups: dict[int, list[float]] = {}
    for rec in envs[0].history:
        if rec.initial_gflops > 0 and rec.best_gflops > 0:
            speedups.setdefault(rec.reset_point, []).append(math.log(rec.best_gflops / rec.initial_gflops))
    return means, [math.exp(float(np.mean(speedups[k]))) for k in sorted(speedups)]


def plot_learning_curve(means: list[float], speedups: list[float], path: Path) -> None:
    """Mean episode return and the geomean speedup of the episodes' best schedules per iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
    ax1.plot(range(len(means)), means)
    ax1.set(xlabel="iteration", ylabel="mean episode return", title="PPO on LoopTune: return")
    ax2.plot(range(len(speedups)), speedups)
    ax2.set(xlabel="iteration", ylabel="geomean best / untuned", title="training episodes: best speedup")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def fresh_measurers(args: Args):
    """A function making measurers with no disk cache (for the analytic model of the tests,
    one shared deterministic model)."""
    from timerl.envs.looptune.measure import AnalyticCostModel, TVMMeasurer

    if args.measurer == "tvm":
        return lambda: TVMMeasurer(disk_cache=False)
    model = AnalyticCostModel()
    return lambda: model


def main(args: Args) -> dict:
    trl.run.setup_logging()
    from timerl.envs.looptune import dataset, evaluate

    name = args.env_id.split(".", 1)[1]
    train_all, test = dataset.split(name, seed=0)
    train_set = _subset(train_all, args.train_problems, args.seed)
    test = _subset(test, args.eval_problems, args.seed + 1)
    out = Path(args.out_dir)
    ckpt = out / "checkpoints"
    if args.checkpoint_every <= 0:
        args.checkpoint_every = args.iterations  # the final policy
    args.checkpoint_dir = str(ckpt)
    print(
        f"LoopTune {args.env_id}: training PPO on {len(train_set)} train problems, {args.num_envs} envs x "
        f"{args.iterations} iterations ({args.measurer} measurer, {args.backend} backend, reward {args.reward})",
        flush=True,
    )
    t0 = time.perf_counter()
    means, speedups = train(args, train_set)
    train_s = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    curve = out / "learning_curve.png"
    plot_learning_curve(means, speedups, curve)
    weights = latest_weights(str(ckpt))
    print(f"trained in {train_s:.0f}s; policy saved in {ckpt}; tuning {len(test)} test problems", flush=True)

    results = tune_with_policy(args, weights, test)
    (out / "policy_results.json").write_text(json.dumps(results, indent=1))
    # fresh measurers, best of --remeasure: not the cached measurement that chose the schedule
    fresh = fresh_measurers(args)
    reference = evaluate.BestOf(fresh, max(1, args.remeasure))
    tuners = {"ppo": evaluate.policy_tuner(results, reference)}
    if args.searches:
        names = [s for s in args.searches.split(",") if s]
        tuners.update(
            evaluate.search_tuners(names, fresh, time_limit=args.search_time_limit, remeasure=reference)
        )
    meta = {"args": asdict(args), "train_seconds": train_s, "mean_returns": means, "train_speedups": speedups}
    report = evaluate.evaluate(test, tuners, reference, meta=meta, progress=args.progress and not args.quiet)
    paths = evaluate.write_report(report, out)
    print(evaluate.format_summary(report))
    print(f"training: {train_s:.0f}s, mean return per iteration {[round(m, 3) for m in means]}")
    print(f"results: {paths['results.csv']}, plots: {paths['fig8.png']}, {paths['fig9.png']}, {curve}")
    return {"means": means, "speedups": speedups, "report": report, "train_seconds": train_s}


if __name__ == "__main__":
    main(parse_args())

# LoopTune (Grubisic et al.) with PPO as a timerl program: the agent learns to schedule
# matmul loop nests (cursor / swap / split actions; reward: the log speedup of the episode's
# best schedule, measured by compiling the nest with TVM and timing it). Before training, a
# search on this CPU's analytic cost model proposes a few schedules per training problem and
# the fastest measured one becomes that problem's demonstration (--seed-demos); every PPO
# update also imitates each training problem's best measured episode (--bc-coef). Then the
# greedy policy tunes unseen test problems and the script prints tuned vs untuned GFLOPS (and
# NumPy's), each measured again by fresh measurers (best of --remeasure, no disk cache).
# The helpers live in timerl/envs/looptune/ppo_run.py.
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import timerl as trl
from timerl.agents import ppo  # the PPO program over any env (examples/ppo.py trains it)
from timerl.envs.looptune import ppo_run


@dataclass
class Args(ppo.PPOArgs):
    env_id: str = "looptune.mm"
    """the LoopTune dataset (looptune.mm: matmuls with m, n, k in 64..256 step 16)"""
    num_envs: int = 8
    """parallel environments (the batch dim b): one problem each per episode"""
    iterations: int = 150
    """training iterations (one Adam step each); each runs one 10-action episode per env"""
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
    happen to find a paying move (a lottery over seeds)"""
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
    ray_address: str = ""
    """measure on a Ray measurement farm: the cluster's host:port (what `ray start --head`
    prints), or local for a Ray started on this machine; empty: measure in this process
    (docs/distributed.md)"""
    farm_workers: int = 0
    """with --ray-address: measurement workers, one pinned core each (0: one per CPU of
    the cluster)"""
    progress: bool = True
    """progress bars with the time left (tqdm) instead of one line per iteration"""
    out_dir: str = "runs/ppo_looptune"
    """where the policy checkpoint, results (CSV/JSON), plots and the training metrics
    (metrics.csv, TensorBoard events) go"""


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(
        Args, defaults, "LoopTune: PPO over loop-nest schedules, as a timerl program", check=ppo.check_args
    )


def main(args: Args) -> dict:
    trl.run.setup_logging()
    from timerl.envs.looptune import dataset, evaluate

    name = args.env_id.split(".", 1)[1]
    train_all, test = dataset.split(name, seed=0)
    train_set = ppo_run.subset(train_all, args.train_problems, args.seed)
    test = ppo_run.subset(test, args.eval_problems, args.seed + 1)
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
    means, speedups = ppo_run.train(args, train_set, say=lambda m: print(m, flush=True))
    train_s = time.perf_counter() - t0
    out.mkdir(parents=True, exist_ok=True)
    curve = out / "learning_curve.png"
    ppo_run.plot_learning_curve(means, speedups, curve)
    weights = ppo_run.latest_weights(str(ckpt))
    print(f"trained in {train_s:.0f}s; policy saved in {ckpt}; tuning {len(test)} test problems", flush=True)

    results = ppo_run.tune_with_policy(args, weights, test)
    (out / "policy_results.json").write_text(json.dumps(results, indent=1))
    # fresh measurers, best of --remeasure: not the cached measurement that chose the schedule
    fresh = ppo_run.fresh_measurers(args.measurer)
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

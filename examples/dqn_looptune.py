# DQN with Double-DQN targets and proportional prioritised replay, APEX-style (LoopTune found
# it best for loop scheduling), as one recurrent-tensor program: timerl/agents/dqn.py
# (`timerl.agents.dqn`: K learner steps per iteration on minibatches from a replay buffer
# behind UDFs, then B epsilon-greedy actors run one episode each). This script trains it and
# logs the returns; on LoopTune (`--env-id looptune.mm`, the default; `--measurer analytic`
# for a quick run without TVM) the demonstrations of examples/ppo_looptune.py (the fastest
# measured candidate of a search on this CPU's analytic model, --seed-demos) enter every
# learner step through DQfD's large-margin loss (--demo-coef), then it plays the greedy
# Q-policy on the same test problems as PPO and reports every schedule measured again by
# fresh measurers.
#   python examples/dqn_looptune.py --env-id gym.CartPole-v1 --iterations 50
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

import timerl as trl
from timerl.agents.dqn import DQNArgs, build, looptune_problems


@dataclass
class Args(DQNArgs):
    """DQN's hyperparameters (``timerl.agents.dqn.DQNArgs``: --env-id, --num-envs,
    --learner-steps, ...) and the run flags; a field declared here adds a flag."""

    iterations: int = 80
    """training iterations (K learner steps, then one episode per actor)"""
    eps_start: float = 0.5
    """epsilon at iteration 0 (the demonstrations, not random actions, find the tiles)"""


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(Args, defaults, "DQN with prioritised replay as a timerl program")


def main(args: Args) -> list[float]:
    trl.run.setup_logging()
    logging.getLogger("timerl.agents.dqn").setLevel(logging.INFO)  # the demonstrations made
    returns: dict[int, list[float]] = {}
    stats: dict[int, tuple[float, float]] = {}
    means: list[float] = []
    t0 = time.perf_counter()
    steps = 0
    run: trl.run.RunLog | None = None  # made once compiled: its bar times iterations only

    def report(it: int) -> None:
        if len(returns.get(it, ())) == args.num_envs and it in stats:
            m = float(np.mean(returns[it]))
            means.append(m)
            loss, eps = stats[it]
            line = (
                f"iter {it:4d}  mean return {m:9.3f}  best actor {max(returns[it]):9.3f}  eps {eps:5.3f}  "
                f"loss {loss:8.4f}  env steps {steps:8d}  time {time.perf_counter() - t0:7.1f}s"
            )
            assert run is not None
            run.log(it, line, mean_return=m, best_actor=max(returns[it]), eps=eps, loss=loss, env_steps=steps)

    def log_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        nonlocal steps
        it = pt["i"]
        if "b" in pt:
            returns.setdefault(it, []).append(float(v[0]))
            steps += int(v[1])
        else:
            stats[it] = (float(v[0]), float(v[1]))
        report(it)

    looptune = args.env_id.startswith("looptune.")
    if looptune:
        out = Path(args.out_dir)
        if args.checkpoint_every <= 0:
            args.checkpoint_every = args.iterations  # the final Q-network
        args.checkpoint_dir = str(out / "checkpoints")
    params: dict[str, Any] = {}
    ex = build(args, log_fn, final_params=params if looptune else None)
    print(
        f"compiled in {time.perf_counter() - t0:.1f}s; running {args.iterations} iterations "
        f"of {args.env_id} on {args.backend}"
    )
    run = trl.run.RunLog(args.out_dir, args.iterations, f"DQN {args.env_id}", args.quiet)
    ex.execute()
    run.close(curve="mean_return", x="env_steps")
    if looptune:
        from timerl.looptune import Policy

        saved = Policy.from_weights(params, "dqn", activation="relu").save(Path(args.out_dir) / "policy.npz")
        print(f"Q-network saved in {saved}", flush=True)
        evaluate_looptune(args, means, time.perf_counter() - t0)
    return means


def evaluate_looptune(args: Args, means: list[float], train_s: float) -> Any:
    """The greedy Q-policy (argmax over the actions that change the nest) on the test
    problems, every reported schedule measured again by fresh measurers (best of
    ``--remeasure``), as examples/ppo_looptune.py reports PPO; writes results.csv/json,
    summary.txt and Fig. 8/9/10 into ``--out-dir``."""
    from timerl.envs.looptune import evaluate
    from timerl.envs.looptune.measure import AnalyticCostModel, TVMMeasurer
    from timerl.looptune import Policy

    if args.measurer == "analytic":
        model = AnalyticCostModel()
        fresh: Any = lambda: model  # noqa: E731  deterministic: one shared model
    else:
        fresh = lambda: TVMMeasurer(disk_cache=False)  # noqa: E731
    policy = Policy.load(Path(args.out_dir) / "policy.npz")
    reference = evaluate.BestOf(fresh, max(1, args.remeasure))
    test = looptune_problems(args)[1]
    print(f"trained in {train_s:.0f}s; tuning {len(test)} test problems with the greedy Q-policy", flush=True)
    tuners = {"dqn": evaluate.policy_rollout_tuner(policy, fresh(), reference)}
    meta = {"args": asdict(args), "train_seconds": train_s, "mean_returns": means}
    report = evaluate.evaluate(test, tuners, reference, meta=meta, progress=not args.quiet)
    paths = evaluate.write_report(report, args.out_dir)
    print(evaluate.format_summary(report))
    print(f"results: {paths['results.csv']}, plots: {paths['fig8.png']}, {paths['fig9.png']}")
    return report


if __name__ == "__main__":
    main(parse_args())

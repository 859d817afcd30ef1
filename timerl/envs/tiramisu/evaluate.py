"""Evaluation of the Tiramisu-style agent: ``python -m timerl.envs.tiramisu.evaluate --run-dir RUN``
(``papers/tiramisu_rl.txt`` §4.2.2, Fig. 4.4/4.5).

Per benchmark, the speedup over the untransformed program (both gcc -O3) of the trained
policy's greedy episode (the fastest schedule it measured, as the searches report theirs;
column agent_last: its last schedule), of a beam search with the same number of
measurements, and of the best of random schedules with the same number again; geomean
table and bar plot.
Every method keeps its schedule the same way (search.pick_best): its --pick-top fastest
measured schedules and the untransformed program are re-measured by --pick-repeats fresh
measurers and the highest median wins (these runs are counted in the measurements columns,
as "search + re-measurements", the same for every method). Every reported speedup is then
measured again, independently of the pick, by fresh measurers (no cache): the median of
--remeasure paired runs against the untransformed binary. Results: results.md (the table),
results.json, results.csv (one row per benchmark) and speedups.png in --out-dir; while it
runs, results.partial.json / results.partial.md hold what has been measured so far
(rewritten after the agent's rollouts and after each benchmark's searches), so a run
stopped early keeps its finished benchmarks.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import timerl as trl
from timerl.agents import tiramisu
from timerl.envs.tiramisu.actions import ACTIONS, NEXT
from timerl.envs.tiramisu.benchmarks import HAND_SCHEDULES, benchmark, benchmark_names
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.schedule import Schedule
from timerl.envs.tiramisu.search import apply_sequence, beam_search, pick_best, random_search


@dataclass
class Args:
    run_dir: str = "runs/ppo_tiramisu"
    """the training run (its checkpoints/ and train.json); empty: baselines only"""
    budget: int = 0
    """measurements for the searches per benchmark (0: as many as the agent used, at least 2)"""
    ceiling_budget: int = 0
    """also run beam and random search with this many measurements (columns beam@N, random@N)"""
    beam_width: int = 4
    """beam search width"""
    remeasure: int = 3
    """fresh paired measurements per reported speedup (median)"""
    benchmarks: str = ""
    """comma-separated subset (default: all 8)"""
    threads: int = 1
    """OpenMP threads of the measured programs (0: the CPU count; 1, as the training's default:
    serial kernels timed with the CPU-time clock)"""
    seed: int = 0
    """seed of the random search"""
    hand: bool = True
    """also re-measure the hand-written schedules of benchmarks.HAND_SCHEDULES (column hand:
    the best of them; the action space's ceiling as far as it is known)"""
    out_dir: str = ""
    """where results.json, results.csv, results.md and speedups.png go (default: run_dir,
    beside the training run's files, which keep their names)"""
    quiet: bool = False
    """no progress bars (the per-benchmark lines are still printed)"""
    samples: int = 0
    """best-of-K: also sample K episodes per benchmark from the policy (every schedule
    measured), report the fastest schedule they measured (column agent@K) and run beam
    and random search with as many measurements as those K episodes made (beam@K,
    random@K); 0: off"""
    sample_seed: int = 0
    """seed of the policy's sampling for --samples"""
    skip_searches: bool = False
    """skip the budget-matched searches of the greedy episode (columns beam, random)"""
    checkpoint: str = ""
    """the policy's checkpoint file (a ckpt_<k>.json of run_dir/checkpoints; default: the latest)"""
    pick_top: int = 3
    """every method (agent, best-of-K, beam, random) keeps the fastest of its this many fastest
    measured schedules and the untransformed program by re-measurement (search.pick_best;
    0: no re-measurement, each method keeps its fastest schedule by the in-search times)"""
    pick_repeats: int = 3
    """fresh measurements per candidate of that pick (median)"""


def replay(task: TiramisuTask, actions: tuple[int, ...], seen: dict[str, Schedule] | None = None):
    """``(last, best, measured)``: the schedule at the end of an episode, the fastest one
    it measured (by the shared measurer's cached times: one in-episode measurement each)
    and the distinct schedules it measured by key, the untransformed one included (``seen``,
    if given, collects them across episodes; its size is the budget a search gets)."""
    s, br = task.initial, 0
    seen = {} if seen is None else seen
    seen[task.initial.key] = task.initial
    best, best_t = s, task.seconds(s)
    for a in actions:
        if a == NEXT:
            br += 1
            if br >= len(task.program.branches):
                break
            continue
        new = task.try_action(s, br, a)
        if new is not None and math.isfinite(t := task.seconds(new)):
            seen[new.key] = new
            s = new
            if t < best_t:
                best, best_t = new, t
    return s, best, seen


def best_of_episodes(task: TiramisuTask, episodes: list[tuple[int, ...]]):
    """``(best, measured)``: the fastest schedule measured over several episodes' action
    sequences (by the shared measurer's cached times) and the distinct schedules they
    measured by key (their number is the budget a search gets for a fair comparison)."""
    seen: dict[str, Schedule] = {}
    best, best_t = task.initial, task.seconds(task.initial)
    for acts in episodes:
        _, b, _ = replay(task, acts, seen)
        if (t := task.seconds(b)) < best_t:
            best, best_t = b, t
    return best, seen


def check_measured(records) -> None:
    """Raise if an episode of the evaluation used a predicted time: the reported speedups
    must come from measurements (the agent's rollouts run without the surrogate)."""
    bad = [r.program for r in records if r.predicted_steps or r.final_predicted or r.best_predicted]
    if bad:
        raise trl.TimeRLError(
            f"evaluation: the episodes of {bad} used predicted times; they must be measured"
        )


def fresh_speedup(sched, n: int, threads: int | None) -> float:
    """Median over ``n`` fresh measurers of untransformed / transformed seconds."""
    vals = []
    for _ in range(n):
        m = Measurer(disk_cache=False, threads=threads)
        t = m.seconds(sched)
        vals.append(m.base_seconds(sched.program) / t if math.isfinite(t) else 0.0)
    return float(np.median(vals))


def report(sched, args: Args, reported: dict[str, float]) -> float:
    """``sched``'s reported speedup (:func:`fresh_speedup`), measured once per schedule key
    (``reported``: the program's figures so far, shared by every column)."""
    if sched.key not in reported:
        reported[sched.key] = fresh_speedup(sched, args.remeasure, args.threads or None)
    return reported[sched.key]


def keep(
    row: dict,
    method: str,
    task: TiramisuTask,
    measured,
    args: Args,
    picks: dict[str, float],
    reported: dict[str, float],
) -> Schedule:
    """Pick ``method``'s schedule among its ``measured`` ones (:func:`pick_best`, the same
    for every method; ``picks``: the program's shared re-measurement cache), report it by
    an independent :func:`fresh_speedup` (``reported``: by schedule key, so a schedule two
    methods keep gets one figure) and record both in ``row``; the kept schedule."""
    measured = list(measured)
    first = min(measured, key=task.seconds, default=task.initial)  # the single-measurement pick
    best = first
    if args.pick_top > 0:
        pk = pick_best(task, measured, args.pick_top, args.pick_repeats, cache=picks)
        best = pk.best
        row[f"{method}_remeasured"] = pk.measurements
        row[f"{method}_pick"] = [list(c) for c in pk.candidates]
    row[method] = report(best, args, reported)
    row[f"{method}_schedule"] = best.key
    row[f"{method}_in_search_best"] = first.key
    return best


def geomean(xs) -> float:
    xs = [x for x in xs if x > 0]
    return float(math.exp(np.mean(np.log(xs)))) if xs else 0.0


def _budget(r: dict, key: str, method: str) -> str:
    """``"9"`` or, when the method's pick re-measured, ``"9+12"`` (search + re-measurements)."""
    extra = r.get(f"{method}_remeasured")
    return str(r.get(key, "-")) + (f"+{extra}" if extra is not None else "")


def table(rows: dict, names: list[str], methods: list[str], k: int) -> str:
    """The markdown table: one row per benchmark of ``names`` (a missing value: ``-``) and,
    for the methods every listed benchmark has, the geomean."""
    lines = [
        "| benchmark | -O3 ms | measurements | " + " | ".join(methods) + " |",
        "|---|---|---|" + "---|" * len(methods),
    ]
    for n in names:
        r = rows[n]
        meas_col = _budget(r, "budget", "agent") + (
            f" / {_budget(r, f'budget@{k}', f'agent@{k}')}" if f"budget@{k}" in r else ""
        )
        ms = f"{r['untransformed_ms']:.1f}" if "untransformed_ms" in r else "-"
        lines.append(
            f"| {n} | {ms} | {meas_col} | "
            + " | ".join(f"{r[m]:.2f}x" if m in r else "-" for m in methods)
            + " |"
        )
    geo = {m: geomean([rows[n][m] for n in names]) for m in methods if all(m in rows[n] for n in names)}
    lines.append(
        "| **geomean** | | | " + " | ".join(f"**{geo[m]:.2f}x**" if m in geo else "-" for m in methods) + " |"
    )
    return "\n".join(lines)


def write_partial(
    out: Path, rows: dict, names: list[str], done: list[str], phase: str, t0: float, k: int
) -> None:
    """``results.partial.json`` / ``.md``: everything measured so far (``done``: the
    benchmarks whose searches finished; ``phase``: the last finished step), written
    atomically so that an evaluation stopped by a deadline keeps its finished benchmarks."""
    cols = ("agent", "agent_last", f"agent@{k}", "beam", "random", f"beam@{k}", f"random@{k}", "hand")
    methods = [m for m in cols if any(m in rows[n] for n in names)]
    res = {"rows": rows, "done": done, "phase": phase, "seconds": time.perf_counter() - t0}
    for name, text in (
        ("results.partial.json", json.dumps(res, indent=1)),
        (
            "results.partial.md",
            f"phase: {phase}; searches done: {', '.join(done) or 'none'}\n\n"
            + table(rows, names, methods, k)
            + "\n",
        ),
    ):
        tmp = out / (name + ".tmp")
        tmp.write_text(text)
        tmp.replace(out / name)


def plot(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows) + ["geomean"]
    methods = list(next(iter(rows.values())))
    fig, ax = plt.subplots(figsize=(10, 3.8))
    w = 0.8 / len(methods)
    for j, meth in enumerate(methods):
        vals = [rows[n][meth] for n in rows] + [geomean([rows[n][meth] for n in rows])]
        ax.bar(np.arange(len(names)) + (j - (len(methods) - 1) / 2) * w, vals, w, label=meth)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), names, rotation=20)
    ax.set_ylabel("speedup over -O3 untransformed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(args: Args) -> dict:
    trl.run.setup_logging()
    names = [n for n in args.benchmarks.split(",") if n] or benchmark_names()
    programs = [benchmark(n) for n in names]
    out = Path(args.out_dir or args.run_dir or "runs/tiramisu_eval")
    out.mkdir(parents=True, exist_ok=True)
    threads = args.threads or None
    measurer = Measurer(threads=threads)  # shared, cached: what the agent and searches see
    tasks = {p.name: TiramisuTask(p, measurer) for p in programs}
    rows: dict[str, dict] = {n: {} for n in names}
    picks: dict[str, dict[str, float]] = {n: {} for n in names}  # re-measured medians, by key
    reported: dict[str, dict[str, float]] = {n: {} for n in names}  # reported speedups, by key
    used: dict[str, int] = {}
    t0 = time.perf_counter()
    if args.run_dir and (Path(args.run_dir) / "checkpoints").exists():
        tj = Path(args.run_dir) / "train.json"  # absent when training was stopped early: args.json
        aj = Path(args.run_dir) / "args.json"
        cfg = json.loads(tj.read_text())["args"] if tj.exists() else {}
        if not cfg and aj.exists():
            cfg = json.loads(aj.read_text())
        targs = tiramisu.TiramisuArgs(
            **{k: v for k, v in cfg.items() if k in tiramisu.TiramisuArgs.__dataclass_fields__}
        )
        weights = tiramisu.latest_weights(args.checkpoint or str(Path(args.run_dir) / "checkpoints"))
        recs = tiramisu.greedy_rollouts(targs, weights, programs, measurer=measurer)
        check_measured(recs)
        agent_bar = trl.run.progress(
            list(zip(recs, programs, strict=True)), desc="agent: re-measuring", quiet=args.quiet, unit="bench"
        )
        for rec, p in agent_bar:
            last, _, measured = replay(tasks[p.name], rec.actions)
            used[p.name] = len(measured)
            keep(
                rows[p.name], "agent", tasks[p.name], measured.values(), args, picks[p.name], reported[p.name]
            )
            rows[p.name]["agent_last"] = report(last, args, reported[p.name])
            rows[p.name]["agent_last_schedule"] = last.key
            rows[p.name]["agent_actions"] = list(rec.actions)
        write_partial(out, rows, names, [], "greedy agent", t0, args.samples)
    k = args.samples
    if k > 0 and args.run_dir and (Path(args.run_dir) / "checkpoints").exists():
        per_prog = tiramisu.sampled_rollouts(
            targs, weights, programs, k, measurer=measurer, seed=args.sample_seed
        )
        for eps, p in zip(per_prog, programs, strict=True):
            check_measured(eps)
            _, measured = best_of_episodes(tasks[p.name], [rec.actions for rec in eps])
            rows[p.name][f"budget@{k}"] = len(measured)
            keep(
                rows[p.name],
                f"agent@{k}",
                tasks[p.name],
                measured.values(),
                args,
                picks[p.name],
                reported[p.name],
            )
            rows[p.name][f"agent@{k}_episodes"] = [
                " ".join(ACTIONS[a].name for a in rec.actions) for rec in eps
            ]
        write_partial(out, rows, names, [], f"agent@{k}", t0, k)
    agent_s = time.perf_counter() - t0
    bar = trl.run.progress(names, desc="searches", quiet=args.quiet, unit="bench")
    done: list[str] = []
    for n in bar:
        bar.set_postfix_str(n, refresh=False)
        budget = args.budget or max(2, used.get(n, 2))
        rows[n]["budget"] = budget
        if not args.skip_searches:
            b = beam_search(tasks[n], budget, width=args.beam_width)
            r = random_search(tasks[n], budget, seed=args.seed)
            keep(rows[n], "beam", tasks[n], b.measured, args, picks[n], reported[n])
            keep(rows[n], "random", tasks[n], r.measured, args, picks[n], reported[n])
        if f"budget@{k}" in rows[n]:
            bk = beam_search(tasks[n], rows[n][f"budget@{k}"], width=args.beam_width)
            rk = random_search(tasks[n], rows[n][f"budget@{k}"], seed=args.seed)
            keep(rows[n], f"beam@{k}", tasks[n], bk.measured, args, picks[n], reported[n])
            keep(rows[n], f"random@{k}", tasks[n], rk.measured, args, picks[n], reported[n])
        rows[n]["untransformed_ms"] = 1e3 * measurer.base_seconds(tasks[n].program)
        if args.hand and n in HAND_SCHEDULES:
            hand = [
                (fresh_speedup(apply_sequence(tasks[n], h), args.remeasure, threads), h)
                for h in HAND_SCHEDULES[n]
            ]
            rows[n]["hand"], rows[n]["hand_schedule"] = max(hand)
        if args.ceiling_budget > 0:
            c = args.ceiling_budget
            bc = beam_search(tasks[n], c, width=args.beam_width)
            rc = random_search(tasks[n], c, seed=args.seed)
            keep(rows[n], f"beam@{c}", tasks[n], bc.measured, args, picks[n], reported[n])
            keep(rows[n], f"random@{c}", tasks[n], rc.measured, args, picks[n], reported[n])
        bar.write(
            f"{n}: "
            + " ".join(
                f"{k} {rows[n][k]:.2f}x"
                for k in (
                    "agent",
                    "agent_last",
                    "beam",
                    "random",
                    f"agent@{args.samples}",
                    f"beam@{args.samples}",
                    f"random@{args.samples}",
                    f"beam@{args.ceiling_budget}",
                    f"random@{args.ceiling_budget}",
                    "hand",
                )
                if k in rows[n]
            )
            + f" (budget {budget}"
            + (f", best-of-{k} budget {rows[n][f'budget@{k}']})" if f"budget@{k}" in rows[n] else ")")
            + " agent actions: "
            + " ".join(ACTIONS[a].name for a in rows[n].get("agent_actions", []))
        )
        done.append(n)
        write_partial(out, rows, names, done, f"searches {n}", t0, k)
    extra = (
        [f"beam@{args.ceiling_budget}", f"random@{args.ceiling_budget}"] if args.ceiling_budget > 0 else []
    )
    sampled = [f"agent@{k}", f"beam@{k}", f"random@{k}"] if k > 0 else []
    methods = [
        m
        for m in ("agent", "agent_last", "beam", "random", *sampled, *extra, "hand")
        if all(m in r for r in rows.values())
    ]
    geo = {m: geomean([rows[n][m] for n in names]) for m in methods}
    text = table(rows, names, methods, k)
    (out / "results.md").write_text(text + "\n")
    res = {"rows": rows, "geomean": geo, "agent_seconds": agent_s, "total_seconds": time.perf_counter() - t0}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    trl.run.write_csv(out / "results.csv", [{"benchmark": n, **rows[n]} for n in names])
    plot({n: {k: rows[n][k] for k in methods} for n in names}, out / "speedups.png")
    print(text)
    print(
        f"written {out / 'results.md'}, {out / 'results.json'}, {out / 'results.csv'}, {out / 'speedups.png'}"
    )
    return res


if __name__ == "__main__":
    main(trl.run.parse_args(Args, None, "Evaluate the Tiramisu agent against beam and random search"))

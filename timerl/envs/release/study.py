"""The RELEASE study (Ahn et al., 2019): ``python -m timerl.envs.release.study``.

Tunes the knob spaces of ResNet-18 conv2d layers and a matmul with a cost model of
gradient-boosted trees, comparing the search (AutoTVM's simulated annealing vs RELEASE's PPO
agent, a timerl program: :mod:`timerl.agents.ppo` over the knob env with many agents along the
batch dim) and the sampler (AutoTVM's greedy top-k + epsilon vs RELEASE's adaptive k-means
sampling), all four at the same hardware-measurement budget. Every measurement compiles the
configuration with TVM, checks it against NumPy and times it single-threaded. Prints per layer
the measurements and charged wall time to reach 95 % of the best found, the best GFLOPS and the
ratios against SA + greedy; saves the curves and ``results.json``. Results and commands:
``docs/release.md``; a short example of the tuner alone: ``examples/release.py``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Set
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import timerl as trl
from timerl.agents import ppo  # the PPO program over any env (examples/ppo.py trains it)
from timerl.envs.release.cost_model import OBJECTIVES, CostModel
from timerl.envs.release.diversity import check_mode
from timerl.envs.release.env import KnobEnv
from timerl.envs.release.measure import TemplateMeasurer
from timerl.envs.release.rounds import ProgramRounds
from timerl.envs.release.sampling import AdaptiveSampler, GreedySampler
from timerl.envs.release.search import Candidates, SimulatedAnnealing, top_unvisited
from timerl.envs.release.space import FEATURE_KINDS, LAYERS, Config, KnobSpace, layer, template_space
from timerl.envs.release.tuner import INIT_DESIGNS, TuneResult, tune

COMBOS = (("sa", "greedy"), ("sa", "adaptive"), ("rl", "greedy"), ("rl", "adaptive"))


@dataclass
class Args(ppo.PPOArgs):
    # RELEASE's Table 2: Adam 1e-3, discount 0.9, GAE 0.99, 3 epochs, clip 0.3, value 1.0, entropy 0.1
    lr: float = 1e-3
    """Adam step size (RELEASE Table 2)"""
    anneal_lr: bool = False
    """keep the step size constant (the agent trains on across tuning rounds)"""
    gamma: float = 0.9
    """discount factor (Table 2)"""
    gae_lambda: float = 0.99
    """GAE parameter (Table 2)"""
    update_epochs: int = 3
    """PPO epochs per rollout (Table 2)"""
    clip_coef: float = 0.3
    """clipping parameter (Table 2)"""
    vf_coef: float = 1.0
    """value coefficient (Table 2)"""
    ent_coef: float = 0.1
    """entropy coefficient (Table 2)"""
    shared: bool = True
    """the first layer is shared by the policy and value networks (RELEASE §4.1)"""
    layers: int = 1
    """hidden layers (shared); the policy and value heads are linear on it"""
    hidden: int = 64
    """hidden units"""
    num_envs: int = 32
    """search agents along the batch dim b"""
    backend: str = "torch"
    """tensor backend of the PPO program (torch: about 1 s to compile, then ~0.1-0.3 s per round;
    jax spends longer in its first-run JIT)"""
    iterations: int = 4
    """PPO iterations (one episode per agent each) per tuning round"""
    rl_program: str = "once"
    """once: the PPO program is compiled once per tuning run and paused between rounds;
    per-round: compiled every round and resumed from the previous round's checkpoint"""
    episode_len: int = 10
    """steps of one search episode"""
    explore: float = 0.5
    """probability that an agent starts an episode from a random configuration (else from
    one of the best measured)"""
    workloads: str = "C9,C7,MM256"
    """layers to tune (timerl.envs.release.space.LAYERS: ResNet-18's C2..C12, MM256)"""
    budget: int = 96
    """hardware measurements per layer and combination"""
    n_init: int = 8
    """random configurations measured first (the same for every combination)"""
    batch_size: int = 64
    """greedy sampler: measurements per round, after each of which the cost model is refit and
    the search rerun. 64 is AutoTVM's (its tuner measures a plan of 64 between refits, the
    setting RELEASE's measurement counts are against); 8 (``sa+greedy:batch8``) refits 8x as
    often, a stronger baseline than AutoTVM"""
    epsilon: float = 0.05
    """greedy sampler: probability of a random configuration per slot"""
    k_min: int = 4
    """adaptive sampler: smallest k tried"""
    k_max: int = 16
    """adaptive sampler: largest k tried"""
    knee: float = 1.15
    """adaptive sampler: stop growing k when one more cluster cuts the loss by less than this factor"""
    representative: str = "centroid"
    """adaptive sampler: measure the candidate nearest each centroid (centroid, the paper's)
    or the cluster's best by the cost model (best)"""
    adaptive_epsilon: float = 0.0
    """adaptive sampler: probability that a slot goes to a random unvisited configuration
    instead (0: the paper's sampler)"""
    diversity: str = "ties"
    """against plateaus of equivalent candidates (timerl.envs.release.diversity): ties (default:
    both samplers keep one candidate per predicted score; a no-op when no predictions tie;
    fewer stuck runs, docs/release.md); none (the samplers as
    published: AutoTVM's greedy, RELEASE's adaptive); knobs (ties, and greedy takes its top k in
    AutoTVM-style diversity-aware order, weighted by --knob-weight)"""
    cost_objective: str = "regression"
    """cost model's objective: regression (LightGBM regression on GFLOPS over the best measured)
    or rank (LightGBM lambdarank over the measurements as one query, AutoTVM-style rank loss)"""
    cost_features: str = "knob"
    """cost model's features: knob (log2 knob values and three tile products) or itervar (those
    plus AutoTVM-style features of the template's loop nest: extents, iterations, each
    buffer's footprint and reuse per loop, vector lanes, parallel)"""
    clock: str = "cpu"
    """measurer's clock: cpu (the process's CPU time around the calls: time descheduled by
    other processes is not counted) or wall (TVM's time_evaluator)"""
    timing_thread: str = "fresh"
    """where the measurer checks and times a configuration: fresh (a new thread per
    configuration, which starts at the same stack offset every time) or caller (the main
    thread, whose stack offset is drawn per process)"""
    stack_offsets: str = "0,16,32,48"
    """stack offsets (bytes) each configuration is timed at, the fastest kept (some kernels run
    up to 2x slower at some stack alignments); 0 alone: a direct call"""
    estimator: str = "min"
    """measurer's estimator over the timed repeats: min or median"""
    table: str = ""
    """a persistent measurement table (JSON lines, timerl.envs.release.measure.MeasurementTable):
    a configuration is measured for real the first time any process asks for it and recorded;
    later asks, in any process with the same measurer settings, get the recorded value and are
    charged its recorded seconds (one fixed objective for every combination and seed; "": off)"""
    repeats: int = 20
    """measurer's timed repeats (of about 1 ms each; slow kernels: single calls within the same budget)"""
    local: int = 0
    """slots per round for the cost model's best unvisited neighbours (1 or 2 knobs changed) of
    the best measured configuration, taken from the sampler's batch (tuner.local_picks; not in
    the paper; 0: off, the published searches)"""
    walk: int = 0
    """slots per round for model-free moves around the best measured configuration: +-1 index
    of one tile knob (two at once when every one-knob move is measured), drawn at random
    whatever the cost model predicts, taken from the sampler's batch after --local's
    (tuner.walk_picks; not in the paper; 0: off)"""
    walk_stall: int = 0
    """--walk's slots only in rounds after this many rounds in a row without a new best measured
    configuration (0: every round)"""
    ensemble: int = 0
    """cost model: a bootstrap ensemble of this many LightGBM regressors (0: one model, the
    default); its mean plus --ucb standard deviations is the prediction"""
    ucb: float = 0.0
    """cost model: standard deviations of the ensemble added to its mean (an upper confidence
    bound; needs --ensemble >= 2; 0: off)"""
    init_design: str = "random"
    """the initial configurations: random (uniform, AutoTVM's), lhs (a Latin hypercube over the
    knob indices) or maximin (greedy max-min distance among random ones)"""
    ucb_decay: int = 0
    """--ucb's weight falls linearly to 0 at this many measurements (0: constant)"""
    prior: str = ""
    """cost model: fit another layer's records in --table beside the run's own measurements (a
    layer name, e.g. C12; "": off); they fade out by --prior-until measurements"""
    prior_rows: int = 512
    """--prior: records drawn (uniformly, per seed) from the other layer's table"""
    prior_until: int = 64
    """--prior: the prior's weight falls linearly from 1 to 0 at this many measurements"""
    knob_weight: float = 1.0
    """--diversity knobs: weight of the fraction of new knob values against the normalised score"""
    remeasure: int = 3
    """re-time each run's best configuration this many times with fresh measurers (no cache)
    and report the best of them too (0: off): one timing on a busy machine can be 10-25 % off"""
    seeds: int = 1
    """repeat every combination with seeds seed, seed + 1, ... (medians are reported)"""
    plan_size: int = 64
    """candidates a search hands the sampler per round"""
    sa_iters: int = 500
    """simulated annealing: steps per round (AutoTVM's n_iter)"""
    combos: str = ",".join(f"{s}+{m}" for s, m in COMBOS)
    """the search+sampler combinations to run, each with optional :options overriding the
    global flags for that one (so variants share a layer's measurer cache and initial
    configurations): an objective (rank, regression), a feature kind (knob, itervar), epN (PPO
    episode length N), kneeX (adaptive sampling's knee X), localN (--local N), walkN (--walk N), stallR (--walk-stall R); e.g.
    rl+adaptive:rank:itervar:ep20"""
    metaschedule_trials: int = 0
    """also tune every layer with TVM MetaSchedule for this many trials (0: off; needs
    pip install 'timerl[metaschedule]': xgboost-cpu, cloudpickle, psutil)"""
    progress: bool = True
    """a progress bar per tuning run (off: as --quiet)"""
    out_dir: str = "runs/release"
    """where results.json and curves.png go; runs/<layer>/<combo>/seed<k>/ holds each tuning
    run's metrics.csv, TensorBoard events and learning_curve.png (best GFLOPS)"""


def parse_args(defaults: Args | None = None) -> Args:
    return trl.run.parse_args(
        Args, defaults, "RELEASE: PPO search + adaptive sampling vs AutoTVM's SA + greedy"
    )


class RLSearch:
    """RELEASE's PPO search agent as a timerl program (``ppo.build`` over :class:`KnobEnv`).

    ``--rl-program once`` (default): the program is compiled once per tuning run, with
    ``iterations`` iterations per round for at most :meth:`max_rounds` rounds, and run round
    by round (:class:`ProgramRounds`: the env's reset at a round's first iteration pauses
    the program while the tuner samples, measures and refits; it resumes with the refitted
    cost model, the new best configurations and a new env seed via
    :meth:`KnobEnv.retarget`). ``--rl-program per-round``: each round
    compiles the program with ``iterations`` more iterations and resumes it from the
    previous round's checkpoint. Both carry the parameters and Adam moments across rounds
    and give the same candidates for the same seed. The candidates are the ``plan_size``
    best unvisited configurations of the round's trajectory."""

    name = "rl"

    def __init__(self, args: Args) -> None:
        if args.rl_program not in ("once", "per-round"):
            raise ValueError(f"--rl-program must be once or per-round, got {args.rl_program!r}")
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="release_ppo_")
        self.round = 0
        self.compiles = 0
        self.compile_s = 0.0
        self.search_s = 0.0
        self._rounds = ProgramRounds()
        self._env: KnobEnv | None = None

    def max_rounds(self) -> int:
        """Rounds the once-compiled program allows: the tuner stops after 3 rounds that
        measure nothing new, so it runs at most 3 rounds per new measurement plus 3."""
        a = self.args
        return 3 * max(a.budget - a.n_init, 1) + 3

    def close(self) -> None:
        self._rounds.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _compile(self, run: Args, env_fn) -> Any:
        t = time.perf_counter()
        ex = ppo.build(run, lambda v, pt: None, env_fn)
        self.compiles += 1
        self.compile_s += time.perf_counter() - t
        return ex

    def _start_once(self, space: KnobSpace, model: CostModel) -> None:
        a = self.args

        def env_fn(args: Args, B):
            self._env = KnobEnv(space, model, B, (), args.episode_len, args.explore, 0)
            rounds, per = self._rounds, a.iterations  # per round (args: the whole program)

            def pause(point: dict[str, int]) -> None:
                if point.get("i", 0) % per == 0:
                    self._env.retarget(*rounds.boundary())

            self._env.on_reset(pause)
            return self._env

        run = replace(a, iterations=self.max_rounds() * a.iterations, checkpoint_every=0, resume="")
        self._rounds.start(self._compile(run, env_fn))

    def propose(
        self,
        space: KnobSpace,
        model: CostModel,
        visited: Set[Config],
        best: list[Config],
        rng: np.random.Generator,
    ) -> Candidates:
        a = self.args
        t0 = time.perf_counter()
        seed = int(rng.integers(2**31))
        if a.rl_program == "once":
            if not self._rounds.started:
                self._start_once(space, model)
            mark = len(self._env.trajectory)
            self._rounds.run_round((model, best[:8], seed))
            traj = self._env.trajectory[mark:]
        else:
            envs: list[KnobEnv] = []

            def env_fn(args: Args, B):
                envs.append(KnobEnv(space, model, B, best[:8], args.episode_len, args.explore, seed))
                return envs[-1]

            run = replace(
                a,
                iterations=(self.round + 1) * a.iterations,
                checkpoint_every=a.iterations,
                checkpoint_dir=self.dir,
                resume=self.dir if self.round else "",
                show_schedule=a.show_schedule and self.round == 0,  # the same program each round
            )
            self._compile(run, env_fn).execute()
            traj = envs[0].trajectory
        self.round += 1
        self.search_s += time.perf_counter() - t0
        return top_unvisited([c for c, _ in traj], np.array([s for _, s in traj]), visited, a.plan_size)


UCB_MEMBERS = 5  # ensemble members for a ucbK option when ensN / --ensemble does not say


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def combo_args(args: Args, combo: str) -> tuple[str, str, Args]:
    """``search+sampler[:option...]`` -> (search, sampler, the arguments with the options
    applied): an objective, a feature kind, ``epN`` (episode length), ``kneeX``, ``localN``
    (``--local N``), ``walkN`` (``--walk N``), ``stallR`` (``--walk-stall R``), ``best`` /
    ``centroid`` (``--representative``), ``initN`` (``--n-init N``), ``ensN`` (``--ensemble N``)
    or ``ucbK`` (``--ucb K``, with ``--ensemble`` or else ``UCB_MEMBERS`` members);
    ``random`` / ``lhs`` / ``maximin`` (``--init-design``), ``decayN`` (``--ucb-decay N``),
    ``priorLAYER`` (``--prior LAYER``), ``prowsN`` (``--prior-rows N``), ``puntilN``
    (``--prior-until N``); ``batchN`` (``--batch-size N``, and ``--plan-size`` at least N;
    ``sa+greedy:batch8`` refits 8x as often as AutoTVM)."""
    pair, *opts = combo.split(":")
    s_name, m_name = pair.split("+")
    if s_name not in ("sa", "rl") or m_name not in ("greedy", "adaptive"):
        raise ValueError(f"combination {combo!r}: search must be sa or rl, sampler greedy or adaptive")
    for o in opts:
        if o in OBJECTIVES:
            args = replace(args, cost_objective=o)
        elif o in FEATURE_KINDS:
            args = replace(args, cost_features=o)
        elif o.startswith("ep") and o[2:].isdigit():
            args = replace(args, episode_len=int(o[2:]))
        elif o.startswith("knee"):
            args = replace(args, knee=float(o[4:]))
        elif o.startswith("local") and o[5:].isdigit():
            args = replace(args, local=int(o[5:]))
        elif o.startswith("walk") and o[4:].isdigit():
            args = replace(args, walk=int(o[4:]))
        elif o.startswith("stall") and o[5:].isdigit():
            args = replace(args, walk_stall=int(o[5:]))
        elif o in ("best", "centroid"):
            args = replace(args, representative=o)
        elif o.startswith("batch") and o[5:].isdigit() and int(o[5:]) > 0:
            n = int(o[5:])
            args = replace(args, batch_size=n, plan_size=max(args.plan_size, n))
        elif o.startswith("init") and o[4:].isdigit():
            args = replace(args, n_init=int(o[4:]))
        elif o.startswith("ens") and o[3:].isdigit():
            args = replace(args, ensemble=int(o[3:]))
        elif o.startswith("ucb") and _is_float(o[3:]):
            args = replace(args, ucb=float(o[3:]), ensemble=args.ensemble or UCB_MEMBERS)
        elif o in INIT_DESIGNS:
            args = replace(args, init_design=o)
        elif o.startswith("decay") and o[5:].isdigit():
            args = replace(args, ucb_decay=int(o[5:]))
        elif o.startswith("prows") and o[5:].isdigit():
            args = replace(args, prior_rows=int(o[5:]))
        elif o.startswith("puntil") and o[6:].isdigit():
            args = replace(args, prior_until=int(o[6:]))
        elif o.startswith("prior") and o[5:] in LAYERS:
            args = replace(args, prior=o[5:])
        else:
            raise ValueError(
                f"combination {combo!r}: unknown option {o!r} (objectives {OBJECTIVES}, features "
                f"{FEATURE_KINDS}, epN, kneeX, localN, walkN, stallR, best, centroid, batchN, initN, ensN, ucbK, "
                f"{'/'.join(INIT_DESIGNS)}, decayN, priorLAYER, prowsN, puntilN)"
            )
    return s_name, m_name, args


def prior_data(measurer: TemplateMeasurer, args: Args, seed: int) -> tuple[np.ndarray, np.ndarray] | None:
    """``--prior LAYER``: ``--prior-rows`` records of that layer drawn uniformly (seeded by
    ``seed``) from the measurer's table, as (features of ``--cost-features``' kind, GFLOPS over
    the best drawn; invalid 0); None without ``--prior``."""
    if not args.prior:
        return None
    if measurer.table is None:
        raise ValueError(f"--prior {args.prior}: needs --table (the prior is that layer's records in it)")
    other = layer(args.prior)
    recs = measurer.table.records(other)
    if not recs:
        raise ValueError(f"--prior {args.prior}: the table {args.table} has no records of {args.prior}")
    rng = np.random.default_rng([seed, 3])
    pick = rng.choice(len(recs), size=min(args.prior_rows, len(recs)), replace=False)
    sel = [recs[int(j)] for j in np.sort(pick)]
    y = np.array([m.gflops if m.valid else 0.0 for m in sel], np.float64)
    x = template_space(other).features([m.config for m in sel], args.cost_features)
    return x, y / max(y.max(), 1e-9)


def run_layer(
    args: Args, name: str, measurer: TemplateMeasurer, run_stats: dict[str, list[dict]] | None = None
) -> dict[str, list[TuneResult]]:
    """The requested combinations on one layer, once per seed, sharing ``measurer`` (and its
    cache: a configuration measured for one combination is charged its original seconds
    when another asks for it). ``run_stats`` collects per run: real seconds, rounds, seconds
    in the search, and for the PPO search its compiles and their seconds."""
    run_stats = {} if run_stats is None else run_stats
    space = template_space(layer(name))
    ties = check_mode(args.diversity) != "none"
    knob_weight = args.knob_weight if args.diversity == "knobs" else 0.0
    results: dict[str, list[TuneResult]] = {}
    for k in range(args.seeds):
        seed = args.seed + k
        for combo in [c for c in args.combos.split(",") if c]:
            s_name, m_name, cargs = combo_args(args, combo)
            search = (
                SimulatedAnnealing(plan_size=cargs.plan_size, n_iter=cargs.sa_iters)
                if s_name == "sa"
                else RLSearch(replace(cargs, seed=seed))
            )
            sampler = (
                GreedySampler(cargs.batch_size, cargs.epsilon, ties, knob_weight)
                if m_name == "greedy"
                else AdaptiveSampler(
                    cargs.k_min, cargs.k_max, cargs.knee, cargs.representative, cargs.adaptive_epsilon, ties
                )
            )
            log = trl.run.RunLog(
                Path(args.out_dir) / "runs" / name / combo / f"seed{seed}",
                args.budget,
                f"{name} {combo} seed {seed}",
                quiet=args.quiet or not args.progress,
            )
            best = [0.0]

            def tick(m, log=log, best=best) -> None:
                best[0] = max(best[0], m.gflops)
                log.log(len(log.rows), measurements=len(log.rows) + 1, gflops=m.gflops, best_gflops=best[0])

            t0 = time.perf_counter()
            try:
                r = tune(
                    space,
                    search,
                    sampler,
                    measurer,
                    args.budget,
                    seed,
                    cargs.n_init,
                    tick,
                    cargs.cost_objective,
                    cargs.cost_features,
                    cargs.local,
                    cargs.walk,
                    cargs.walk_stall,
                    cargs.ensemble,
                    cargs.ucb,
                    cargs.init_design,
                    cargs.ucb_decay,
                    prior_data(measurer, cargs, seed),
                    cargs.prior_until,
                )
            finally:
                log.close(curve="best_gflops", x="measurements")
                if isinstance(search, RLSearch):
                    search.close()
            results.setdefault(combo, []).append(r)
            real = time.perf_counter() - t0
            search_s = search.search_s if isinstance(search, RLSearch) else 0.0
            stats = {"real_s": real, "rounds": r.rounds, "search_s": search_s}
            if isinstance(search, RLSearch):
                stats.update(compiles=search.compiles, compile_s=search.compile_s)
            run_stats.setdefault(combo, []).append(stats)
            logging.getLogger("timerl.envs.release").info(
                "%s %s seed %d: best %.1f GFLOPS, %d rounds, %.1f s real; %s",
                name,
                combo,
                seed,
                r.best.gflops,
                r.rounds,
                real,
                ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in stats.items()),
            )
    return results


def offsets(text: str) -> tuple[int, ...]:
    """``--stack-offsets 0,16``: the measurer's stack offsets."""
    return tuple(int(x) for x in text.split(",") if x.strip())


def retime(
    name: str,
    results: dict[str, list[TuneResult]],
    times: int,
    clock: str = "cpu",
    estimator: str = "min",
    thread: str = "fresh",
    stack_offsets: tuple[int, ...] = (0, 16, 32, 48),
) -> dict[str, list[float]]:
    """Each run's best configuration timed ``times`` times by fresh measurers (40 repeats, no
    cache, the run's clock, estimator, timing thread and stack offsets); the best of them per run."""
    space = template_space(layer(name))
    out: dict[str, list[float]] = {}
    for combo, runs in results.items():
        for r in runs:
            g = max(
                TemplateMeasurer(
                    repeats=40, clock=clock, estimator=estimator, thread=thread, stack_offsets=stack_offsets
                )
                .measure(space, r.best.config)
                .gflops
                for _ in range(times)
            )
            out.setdefault(combo, []).append(g)
    return out


def _reach(r: TuneResult, gflops: float) -> tuple[int, float, bool]:
    """(measurements, charged seconds, reached): a run that never gets there counts its whole
    budget and time (so the ratios built from it are lower bounds)."""
    hit = r.to_reach(gflops)
    return (hit[0], hit[1], True) if hit else (len(r.measurements), r.elapsed[-1], False)


def summarise(
    name: str, results: dict[str, list[TuneResult]], retimed: dict[str, list[float]] | None = None
) -> list[dict]:
    """Per combination (medians over the seeds): measurements and charged seconds to reach
    95 % of the best GFLOPS any run found on the layer, the best GFLOPS, the measurements to
    reach SA + greedy's final best of the same seed (within 1 %: timing noise), and the
    ratios against SA + greedy."""
    layer_best = max(r.best.gflops for runs in results.values() for r in runs)
    base = results.get("sa+greedy")
    med = lambda xs: float(np.median(xs))  # noqa: E731
    rows = []
    for combo, runs in results.items():
        to95 = [_reach(r, 0.95 * layer_best) for r in runs]
        row = {
            "layer": name,
            "combo": combo,
            "seeds": len(runs),
            "best_gflops": med([r.best.gflops for r in runs]),
            "reached_95": sum(x[2] for x in to95),
            "meas_to_95": med([x[0] for x in to95]),
            "seconds_to_95": med([x[1] for x in to95]),
            "invalid": sum(r.invalid for r in runs),
            "seconds": med([r.elapsed[-1] for r in runs]),
            "best_configs": [r.best.config for r in runs],
            "per_seed": {
                "best_gflops": [round(r.best.gflops, 1) for r in runs],
                "meas_to_95": [x[0] for x in to95],
            },
        }
        if retimed:
            row["retimed_gflops"] = med(retimed[combo])
        if base is not None:
            b95 = [_reach(r, 0.95 * layer_best) for r in base]
            row["x_fewer_meas_to_95"] = med([x[0] for x in b95]) / row["meas_to_95"]
            row["x_less_time_to_95"] = med([x[1] for x in b95]) / row["seconds_to_95"]
            own = [_reach(r, 0.99 * b.best.gflops) for r, b in zip(runs, base, strict=True)]
            ref = [_reach(b, 0.99 * b.best.gflops) for b in base]
            row["meas_to_sa_greedy_best"] = med([x[0] for x in own])
            row["per_seed"]["meas_to_sa_greedy_best"] = [x[0] if x[2] else None for x in own]
            row["reached_sa_greedy_best"] = sum(x[2] for x in own)
            row["x_fewer_meas_to_sa_greedy_best"] = med([x[0] for x in ref]) / row["meas_to_sa_greedy_best"]
            row["gflops_vs_sa_greedy"] = med(
                [r.best.gflops / b.best.gflops for r, b in zip(runs, base, strict=True)]
            )
            if retimed:
                pairs = zip(retimed[combo], retimed["sa+greedy"], strict=True)
                row["retimed_vs_sa_greedy"] = med([g / b for g, b in pairs])
        rows.append(row)
    return rows


def format_rows(rows: list[dict]) -> str:
    cols = [
        ("layer", "layer", "6s"),
        ("search+sampler", "combo", "14s"),
        ("best GFLOPS", "best_gflops", "11.1f"),
        ("reached", "reached_95", "7d"),
        ("meas->95%", "meas_to_95", "9.1f"),
        ("s->95%", "seconds_to_95", "7.1f"),
        ("x fewer meas", "x_fewer_meas_to_95", "12.2f"),
        ("x less time", "x_less_time_to_95", "11.2f"),
        ("meas->SA+G best", "meas_to_sa_greedy_best", "15.1f"),
        ("x fewer (SA+G)", "x_fewer_meas_to_sa_greedy_best", "14.2f"),
        ("GFLOPS vs SA+G", "gflops_vs_sa_greedy", "14.3f"),
        ("re-timed", "retimed_gflops", "8.1f"),
        ("re-timed vs SA+G", "retimed_vs_sa_greedy", "16.3f"),
        ("invalid", "invalid", "7d"),
    ]
    width = {h: max(len(h), int(fmt.rstrip("sdf").split(".")[0])) for h, _, fmt in cols}
    head = " ".join(format(h, f">{width[h]}s") for h, _, _ in cols)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = []
        for h, key, fmt in cols:
            v = r.get(key)
            cells.append(format(format(v, fmt) if v is not None else "-", f">{width[h]}s"))
        lines.append(" ".join(cells))
    return "\n".join(lines)


def format_seeds(rows: list[dict]) -> str:
    """Per combination, the per-seed values behind the medians (None: never reached)."""
    return "\n".join(
        f"{r['layer']} {r['combo']} per seed: " + "; ".join(f"{k} {v}" for k, v in r["per_seed"].items())
        for r in rows
    )


def format_stats(name: str, stats: dict[str, list[dict]]) -> str:
    """Per combination, medians over the seeds: real seconds of the tuning run, rounds, seconds
    in the search (PPO: in its program, compiles included) and the PPO program's compiles."""
    med = lambda xs: float(np.median(xs))  # noqa: E731
    lines = []
    for combo, runs in stats.items():
        line = (
            f"{name} {combo}: {med([s['real_s'] for s in runs]):.1f} s real, "
            f"{med([s['rounds'] for s in runs]):.0f} rounds"
        )
        if "compiles" in runs[0]:
            line += (
                f", {med([s['search_s'] for s in runs]):.1f} s in the PPO program, "
                f"{med([s['compiles'] for s in runs]):.0f} compile(s) taking {med([s['compile_s'] for s in runs]):.1f} s"
            )
        lines.append(line)
    return "\n".join(lines)


def plot_curves(all_results: dict[str, dict[str, list[TuneResult]]], path: Path) -> None:
    """Best GFLOPS vs hardware measurements (mean over seeds), one panel per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(all_results)
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.5), squeeze=False)
    for ax, (name, results) in zip(axes[0], all_results.items(), strict=True):
        for combo, runs in results.items():
            curve = np.mean([r.curve for r in runs], axis=0)
            ax.plot(np.arange(1, len(curve) + 1), curve, label=combo)
        seeds = len(next(iter(results.values())))
        ax.set(xlabel="hardware measurements", ylabel="best GFLOPS", title=f"{name} (mean of {seeds} seeds)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_metaschedule(args: Args, names: list[str], rows: list[dict]) -> list[dict]:
    """TVM MetaSchedule on each layer (``timerl.envs.release.metaschedule``: the layer's compute,
    its best schedules measured by the knob tuners' rule), with ``metaschedule_trials`` trials;
    compared with SA + greedy's median best on the layer (``rows``)."""
    from timerl.envs.release import metaschedule
    from timerl.errors import TimeRLError

    out = []
    for name in names:
        try:
            res = metaschedule.tune_layer(layer(name), args.metaschedule_trials, seed=args.seed)
        except TimeRLError as exc:
            print(f"MetaSchedule {name}: not run ({exc})")
            continue
        base = next(
            (r["best_gflops"] for r in rows if r["layer"] == name and r["combo"] == "sa+greedy"), None
        )
        final = res.runner_curve[-1] if res.runner_curve else 0.0
        to95 = next((j + 1 for j, g in enumerate(res.runner_curve) if g >= 0.95 * final), None)
        row = {
            "layer": name,
            "gflops": res.gflops,
            "trials": res.trials,
            "seconds": res.seconds,
            "runner_gflops": res.runner_gflops,
            "runner_trials_to_95_own": to95,
            "gflops_vs_sa_greedy": res.gflops / base if base else None,
            "runner_curve": list(res.runner_curve),
        }
        vs = f", {row['gflops_vs_sa_greedy']:.3f}x SA + greedy's median best" if base else ""
        print(
            f"MetaSchedule {name}: {res.gflops:.1f} GFLOPS (its runner: {res.runner_gflops:.1f}) after "
            f"{res.trials} trials in {res.seconds:.0f} s{vs}; its runner's curve reached 95 % of its "
            f"final in {to95} trials"
        )
        out.append(row)
    return out


def table_stats(measurer: TemplateMeasurer) -> dict[str, int]:
    """The measurer's asks, those its table answered, the configurations it measured and the
    table's records under its settings ({} without a table)."""
    if measurer.table is None:
        return {}
    return {
        "asks": measurer.asks,
        "hits": measurer.table_hits,
        "measured": measurer.measured,
        "records": len(measurer.table),
    }


def main(args: Args) -> dict:
    trl.run.setup_logging()
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    names = [n for n in args.workloads.split(",") if n]
    print(
        f"RELEASE: {', '.join(names)}; {args.budget} measurements per layer and combination "
        f"({args.combos}), {args.seeds} seed(s); PPO: {args.num_envs} agents x {args.iterations} episodes of {args.episode_len} steps per round",
        flush=True,
    )
    t0 = time.perf_counter()
    measurer = TemplateMeasurer(
        repeats=args.repeats,
        clock=args.clock,
        estimator=args.estimator,
        thread=args.timing_thread,
        stack_offsets=offsets(args.stack_offsets),
        table=args.table or None,
    )
    all_results: dict[str, dict[str, list[TuneResult]]] = {}
    all_stats: dict[str, dict[str, list[dict]]] = {}
    rows: list[dict] = []
    for name in names:
        all_stats[name] = {}
        all_results[name] = run_layer(args, name, measurer, all_stats[name])
        retimed = (
            retime(
                name,
                all_results[name],
                args.remeasure,
                args.clock,
                args.estimator,
                args.timing_thread,
                offsets(args.stack_offsets),
            )
            if args.remeasure > 0
            else None
        )
        layer_rows = summarise(name, all_results[name], retimed)
        rows += layer_rows
        print(format_rows(layer_rows), flush=True)
        print(format_seeds(layer_rows), flush=True)
        print(format_stats(name, all_stats[name]), flush=True)
    table = table_stats(measurer)
    if table:
        print(
            f"table {args.table}: {table['hits']} of {table['asks']} asks answered by the table, "
            f"{table['measured']} configurations measured and recorded; {table['records']} records "
            f"under these settings",
            flush=True,
        )
    ms_rows = run_metaschedule(args, names, rows) if args.metaschedule_trials > 0 else []
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plot_curves(all_results, out / "curves.png")
    curves = {
        n: {c: [r.curve.tolist() for r in runs] for c, runs in res.items()} for n, res in all_results.items()
    }
    (out / "results.json").write_text(
        json.dumps(
            {
                "args": asdict(args),
                "rows": rows,
                "run_stats": all_stats,
                "metaschedule": ms_rows,
                "table": table,
                "curves": curves,
                "measured": {  # per run, the configurations in the order measured, with their GFLOPS
                    n: {
                        c: [[[list(m.config), round(m.gflops, 3)] for m in r.measurements] for r in runs]
                        for c, runs in res.items()
                    }
                    for n, res in all_results.items()
                },
            },
            indent=1,
        )
    )
    print(f"\nall layers:\n{format_rows(rows)}")
    print(
        f"total {time.perf_counter() - t0:.0f} s; curves: {out / 'curves.png'}; results: {out / 'results.json'}"
    )
    return {"rows": rows, "results": all_results, "table": table}


if __name__ == "__main__":
    main(parse_args())

"""The tuning loop: search over the cost model, sample, measure, refit; repeat until the
measurement budget is spent.

``tune(space, search, sampler, measurer, budget)`` first measures ``n_init`` random
configurations (the same ones for every search and sampler with the same ``seed``), fits
the :class:`.CostModel`, then per round asks the search for candidates
(:class:`.Candidates`), the sampler for the configurations to measure, measures them and
refits the model on every measurement. With ``local=n > 0`` (not in the paper or AutoTVM; off by
default) the first ``n`` slots of every round's batch go to the cost model's best unvisited
configurations among the neighbours (1 or 2 knobs changed, :meth:`.KnobSpace.neighbourhood`)
of the best measured configuration (:func:`local_picks`), and the sampler's batch fills the
rest up to its own size (its lowest-ranked picks are dropped); the sampler is called as without
them. With ``walk=n > 0`` (not in the paper or AutoTVM; off by default) ``n`` further
slots, after the local ones, go to model-free moves around the best measured configuration
(:func:`walk_picks`: +-1 index of one tile knob, or of two at once when every one-knob move
is measured, drawn uniformly at random whatever the model predicts); with ``walk_stall=r > 0``
only in rounds that follow ``r`` rounds in a row without a new best measured
configuration, so a run that keeps climbing spends nothing on it.

Entry options (all off by default): ``init_design`` picks the ``n_init`` initial configurations
(:func:`initial_design`): ``"random"`` (AutoTVM's and the paper's: uniformly random valid
configurations), ``"lhs"`` (a Latin hypercube over the knobs' indices: every knob's range cut
into ``n_init`` strata, each stratum used once, :func:`_strata`; of 200 such designs the one with all rows valid
and the largest smallest pairwise distance) or ``"maximin"`` (greedily, the random valid
configuration farthest from those already picked, among 1000). ``ucb_decay=n``: the cost
model's upper-confidence weight falls linearly from ``ucb`` (after the initial
configurations) to 0 at ``n`` measurements. ``prior``: another layer's measurements
(:class:`.CostModel`'s ``prior``, faded out by ``prior_until`` measurements), fitted beside
this run's own. Time is charged as the wall time of the search,
sampling and fitting, plus each measurement's own seconds (:attr:`.Measurement.seconds`,
also when a shared measurer answers from its cache), so tuners that share a measurer are
charged as if each had measured alone.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from timerl.envs.release.cost_model import CostModel
from timerl.envs.release.measure import Measurement, Measurer
from timerl.envs.release.sampling import Sampler
from timerl.envs.release.search import Search
from timerl.envs.release.space import Config, KnobSpace
from timerl.errors import TimeRLError

log = logging.getLogger("timerl.envs.release")


@dataclass(frozen=True)
class TuneResult:
    """Every measurement in order, with the charged seconds at each (cumulative)."""

    layer: str
    search: str
    sampler: str
    measurements: tuple[Measurement, ...]
    elapsed: tuple[float, ...]
    rounds: int

    @property
    def curve(self) -> np.ndarray:
        """Best GFLOPS after each measurement."""
        return np.maximum.accumulate(np.array([m.gflops for m in self.measurements]))

    @property
    def best(self) -> Measurement:
        return max(self.measurements, key=lambda m: m.gflops)

    def to_reach(self, gflops: float) -> tuple[int, float] | None:
        """(measurements, seconds) until the best reached ``gflops``; None if never."""
        hit = np.nonzero(self.curve >= gflops)[0]
        if not len(hit):
            return None
        j = int(hit[0])
        return j + 1, self.elapsed[j]

    @property
    def invalid(self) -> int:
        return sum(not m.valid for m in self.measurements)


def _best_first(done: dict[Config, Measurement]) -> list[Config]:
    """The valid measured configurations, fastest first (the picks' centres in turn)."""
    return sorted((c for c, m in done.items() if m.valid), key=lambda c: -done[c].gflops)


def local_picks(
    space: KnobSpace,
    model: CostModel,
    done: dict[Config, Measurement],
    n: int,
    changes: int = 2,
) -> list[Config]:
    """The ``n`` unvisited configurations that the cost model scores highest among the
    neighbours of the best measured valid configuration (up to ``changes`` knobs changed; ties
    in the neighbourhood's order). Where that neighbourhood has fewer than ``n`` unvisited
    configurations, the next best measured one's are added, and so on."""
    out: list[Config] = []
    taken = set(done)
    for best in _best_first(done):
        if len(out) >= n:
            break
        near = [c for c in dict.fromkeys(space.neighbourhood(best, changes)) if c not in taken]
        if not near:
            continue
        scores = np.asarray(model.predict(near), np.float64)
        for j in np.argsort(-scores, kind="stable")[: n - len(out)]:
            out.append(near[int(j)])
            taken.add(near[int(j)])
    return out


def walk_picks(
    space: KnobSpace,
    done: dict[Config, Measurement],
    n: int,
    rng: np.random.Generator,
    exclude: Sequence[Config] = (),
) -> list[Config]:
    """``n`` unvisited configurations one index step from the best measured valid configuration
    in one tile knob, drawn uniformly at random without the cost model; when every such move is
    measured (or taken), steps in two tile knobs at once (:meth:`.KnobSpace.tile_steps`). Where
    the best's moves run out, the next best measured configuration's follow, and so on.
    ``exclude``: configurations already picked this round."""
    out: list[Config] = []
    taken = set(done) | set(exclude)
    for best in _best_first(done):
        for changes in (1, 2):
            while len(out) < n:
                near = [c for c in dict.fromkeys(space.tile_steps(best, changes)) if c not in taken]
                if not near:
                    break
                pick = near[int(rng.integers(len(near)))]
                out.append(pick)
                taken.add(pick)
        if len(out) >= n:
            break
    return out


INIT_DESIGNS = ("random", "lhs", "maximin")


def _min_distance(points: np.ndarray) -> float:
    """The smallest pairwise Euclidean distance between the rows of ``points``."""
    d = np.sqrt(((points[:, None, :] - points[None, :, :]) ** 2).sum(-1))
    d[np.diag_indices(len(points))] = np.inf
    return float(d.min()) if len(points) > 1 else np.inf


def _strata(size: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` indices of a knob with ``size`` values, one per stratum ``[j * size // n, (j + 1) *
    size // n)`` (drawn uniformly within it; a stratum narrower than one value gives its first),
    so a knob with at least ``n`` values gets ``n`` distinct ones and a smaller knob each of its
    values ``n // size`` or ``n // size + 1`` times."""
    j = np.arange(n)
    lo, hi = j * size // n, (j + 1) * size // n
    return lo + (rng.random(n) * np.maximum(hi - lo, 1)).astype(int)


def initial_design(
    space: KnobSpace, n: int, rng: np.random.Generator, design: str = "random"
) -> list[Config]:
    """``n`` distinct valid configurations to measure before the cost model guides anything (see
    the module doc for the designs); at most ``space.size`` of them."""
    if design not in INIT_DESIGNS:
        raise TimeRLError(f"RELEASE tune: init_design must be one of {INIT_DESIGNS}, got {design!r}")
    n = min(n, space.size)
    out: list[Config] = []
    if design == "lhs" and n > 1:
        best, best_d = None, -1.0
        for _ in range(200):
            cols = [rng.permutation(_strata(size, n, rng)) for size in space.sizes]
            rows = [tuple(int(c[i]) for c in cols) for i in range(n)]
            if len(set(rows)) < n or not all(space.is_valid(r) for r in rows):
                continue
            d = _min_distance(space.normalised(rows))
            if d > best_d:
                best, best_d = rows, d
        out = list(best) if best is not None else []
    elif design == "maximin" and n > 1:
        pool = list(dict.fromkeys(space.random(rng) for _ in range(1000)))
        pts = space.normalised(pool)
        pick = [int(rng.integers(len(pool)))]
        near = np.sqrt(((pts - pts[pick[0]]) ** 2).sum(1))
        while len(pick) < min(n, len(pool)):
            j = int(np.argmax(near))
            pick.append(j)
            near = np.minimum(near, np.sqrt(((pts - pts[j]) ** 2).sum(1)))
        out = [pool[j] for j in pick]
    while len(out) < n:  # random (and the rare design that could not be completed)
        c = space.random(rng)
        if c not in out:
            out.append(c)
    return out


def tune(
    space: KnobSpace,
    search: Search,
    sampler: Sampler,
    measurer: Measurer,
    budget: int,
    seed: int = 0,
    n_init: int = 8,
    on_measure: Callable[[Measurement], None] | None = None,
    objective: str = "regression",
    features: str = "knob",
    local: int = 0,
    walk: int = 0,
    walk_stall: int = 0,
    ensemble: int = 0,
    ucb: float = 0.0,
    init_design: str = "random",
    ucb_decay: int = 0,
    prior: tuple[np.ndarray, np.ndarray] | None = None,
    prior_until: int = 64,
) -> TuneResult:
    """Tune ``space`` with ``budget`` hardware measurements (see the module doc); ``objective``
    is the cost model's (:class:`.CostModel`: regression or rank), ``features`` its feature kind
    (knob or itervar); ``local``: slots per batch for :func:`local_picks`, ``walk``: for
    :func:`walk_picks` (drawn from their own generator, so the search's draws do not move),
    ``walk_stall``: the walk slots only after that many rounds in a row without a new best
    (0: every round); ``ensemble``, ``ucb``: the cost model's bootstrap ensemble and upper
    confidence bound (:class:`.CostModel`; 0: off); ``init_design``, ``ucb_decay``, ``prior``:
    the entry options (see the module doc; off by default). Raises
    :class:`TimeRLError` when no measured configuration is valid."""
    if budget < 1:
        raise TimeRLError(f"RELEASE tune: budget must be >= 1 measurement, got {budget}")
    if local < 0:
        raise TimeRLError(f"RELEASE tune: local must be >= 0 slots, got {local}")
    if walk < 0:
        raise TimeRLError(f"RELEASE tune: walk must be >= 0 slots, got {walk}")
    if walk_stall < 0:
        raise TimeRLError(f"RELEASE tune: walk_stall must be >= 0 rounds, got {walk_stall}")
    if ucb_decay < 0 or (ucb_decay and not ucb):
        raise TimeRLError(
            f"RELEASE tune: ucb_decay must be >= 0 and needs ucb > 0, got {ucb_decay} (ucb {ucb})"
        )
    rng = np.random.default_rng(seed)
    walk_rng = np.random.default_rng([seed, 2])
    model = CostModel(
        space,
        seed=seed,
        objective=objective,
        features=features,
        ensemble=ensemble,
        ucb=ucb,
        prior=prior,
        prior_until=prior_until,
    )
    done: dict[Config, Measurement] = {}
    order: list[Measurement] = []
    elapsed: list[float] = []
    charged = 0.0

    def measure(batch: list[Config]) -> None:
        nonlocal charged
        many = getattr(measurer, "measure_many", None)
        if many is not None:  # a farm's measurer: the batch's new configurations at once
            todo: list[Config] = []
            for cfg in batch:
                if len(order) + len(todo) >= budget:
                    break
                if cfg not in done and cfg not in todo:
                    todo.append(cfg)
            if todo:
                many(space, todo)
        for cfg in batch:
            if len(order) >= budget or cfg in done:
                continue
            m = measurer.measure(space, cfg)
            done[cfg] = m
            order.append(m)
            charged += m.seconds
            elapsed.append(charged)
            if on_measure is not None:
                on_measure(m)
        t = time.perf_counter()
        model.fit(list(done), [m.gflops for m in done.values()])
        charged += time.perf_counter() - t

    init_rng = np.random.default_rng([seed, 1])
    measure(initial_design(space, min(n_init, budget), init_rng, init_design))
    start = len(order)
    rounds = 0
    stale = 0
    flat = 0  # rounds in a row without a new best
    while len(order) < budget:
        if ucb_decay:
            model.ucb = ucb * max(0.0, 1.0 - (len(order) - start) / max(ucb_decay - start, 1))
        t = time.perf_counter()
        ranked = sorted(done, key=lambda c: -done[c].gflops)
        cands = search.propose(space, model, done.keys(), ranked, rng)
        batch = sampler.select(space, cands.configs, cands.scores, done.keys(), budget - len(order), rng)
        walking = walk if flat >= walk_stall else 0
        if local > 0 or walking > 0:
            picks = local_picks(space, model, done, local) if local > 0 else []
            if walking > 0:
                picks += walk_picks(space, done, walking, walk_rng, exclude=picks)
            rest = [c for c in batch if c not in picks]
            batch = (picks + rest)[: max(len(batch), len(picks))]
        charged += time.perf_counter() - t
        before = len(order)
        top = max(m.gflops for m in order)
        measure(batch)
        flat = 0 if max(m.gflops for m in order) > top else flat + 1
        rounds += 1
        stale = stale + 1 if len(order) == before else 0
        if stale >= 3:
            log.warning(
                "RELEASE %s: %s+%s found nothing new to measure; stopping",
                space.layer.name,
                search.name,
                sampler.name,
            )
            break
    if not any(m.valid for m in order):
        errors = sorted({m.error for m in order})[:3]
        raise TimeRLError(
            f"RELEASE {space.layer.name}: none of the {len(order)} configurations measured is valid "
            f"(they failed to build or computed wrong results: {errors}); check the template and the knob space"
        )
    return TuneResult(space.layer.name, search.name, sampler.name, tuple(order), tuple(elapsed), rounds)

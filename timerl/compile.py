"""``ctx.compile``: RT program -> PDG -> passes -> isl schedule -> AST -> runtime executor."""

from __future__ import annotations

import logging
import numbers
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from timerl.errors import PDGError, TimeRLError
from timerl.pdg.ir import PDG
from timerl.pdg.ops import OpKind
from timerl.plan.iterations import kept_values
from timerl.rt.context import Context

log = logging.getLogger("timerl.compile")


@dataclass(frozen=True)
class CompileOptions:
    """Switches for every pass, so each can be checked by running with and without it."""

    vectorize: bool = True  # turn batch-like dims (identity-accessed, static) into concrete dims
    vectorize_time: bool = True  # vectorize the innermost dim where no recurrence needs it
    # ... also when its bound is dynamic (per-episode T): batch axes padded to power-of-two
    # buckets of T, so compiled code is reused across episode lengths (vectorize_partial.py);
    # not with swap=True (learning then fetches the swapped episode one step at a time)
    vectorize_dynamic: bool = True
    simplify: bool = True  # readers of copies and of products with one read the operand
    cse: bool = True  # common-subexpression elimination
    broadcast: bool = True  # elementwise readers of an EXPAND read its operand (NumPy broadcasting)
    contract: bool = True  # summed outer products (weight gradients) as one matmul
    # sums over a whole episode of a dynamic T (x[0:T].sum(0), weight gradients) as running
    # sums while it goes on, so their terms are not all held until it ends (chosen by
    # memory_budget when a peak grows with T; pdg/passes/accumulate.py)
    accumulate: bool = False
    scan_lift: bool = True  # first-order linear recurrences (GAE, returns) as one scan op
    # x[t:T].discounted_sum(g) / x[t:T].sum(0) for every t as rows of one suffix sum of x[0:T]
    # (Monte-Carlo returns; pdg/passes/suffix_scan.py)
    suffix_scan: bool = True
    dce: bool = True  # dead-code elimination
    check_reads: bool = True  # compile-time check that every read point is defined
    fuse: bool = True  # run pure ops at one point as compiled regions (plan/regions.py)
    # JAX: a static loop whose statements are all traceable runs as one lax.scan (its outputs
    # kept as rows of the stacked arrays); see runtime/scan.py and docs/performance.md
    scan_loops: bool = True
    # JAX: the iteration loop's body (acting, learning, the optimiser) traced once and run as
    # one compiled call per iteration, where everything in it is traceable and moves with the
    # iteration (plan/iteration_body.py, runtime/iteration.py); needs scan_loops. "auto": where
    # the host takes a large share of an iteration and the calls, timed against the
    # statements, are no slower (PPO on gymnax: few envs yes, 512 x 250 no; docs/performance.md);
    # True: wherever the plan allows; False: never
    compile_iterations: bool | str = "auto"
    free_iterations: bool = True  # free values of iterations no later point reads
    block_store: bool = True  # slice-read tensors in preallocated buffers updated in place
    dealloc: bool = True  # free each read point after its last reader (frees placed by isl)
    # a compiled region that reads an input last writes an output into the input's buffer
    # (JAX: donate_argnums; Torch: an elementwise result written in place, run_into; needs
    # dealloc and fuse; plan/donate.py, docs/memory.md)
    donate: bool = True
    # offload tensors over swap_threshold bytes per point with more than one symbolic dim to
    # the host pool between their consumers and fetch them back (placed by isl; needs dealloc;
    # schedule/swap.py, docs/memory.md "Swapping")
    swap: bool = False
    swap_threshold: str | int = 1 << 20
    memory_timeline: bool = False  # sample live bytes per pool at every put/free (memory_timeline())
    # split innermost loops into first / middle / last iterations where that takes If's out of
    # them (schedule/peel.py, TimeRL §6.3's partial unrolling). Off by default: JAX then scans
    # middle pieces whose stacked rows hold every iteration, and fewer buffers are donated
    peel: bool = False
    # bytes ("2GB", "512MiB" or an int): estimate the peak from the schedule before running and
    # fail (MemoryBudgetError) when it cannot fit; turns dealloc on if that fits (plan/peak.py)
    memory_budget: str | int | None = None
    # the most each dynamic bound can reach ({T: 1000}): a memory_budget then holds when the
    # estimated peak at these values fits, even if it grows with them; an episode that runs
    # past its bound is a BoundError at run time (fit_dynamic.py; docs/memory.md)
    max_bounds: Mapping[Any, int] | tuple[tuple[str, int], ...] = ()
    # log at INFO (and keep as executor.memory_explanation) the estimated peak, which tensors
    # grow with which dynamic bound, the reads that hold them and what would bound them
    # (plan/explain.py; the tries rebuild the program, so compiling takes longer)
    explain_memory: bool = False
    # bytes ("64MiB" or an int): reductions reading more are computed in blocks along a new dim
    # (TimeRL Alg. 3, pdg/passes/incrementalize.py; docs/memory.md); None: off
    incrementalize: str | int | None = None
    # RNG seed (random ops draw per (seed, node, point)); with agents (trl.param(agents=...)):
    # agent k draws as a one-agent run with seed + k, or with seed[k] when one is given per agent
    seed: int | tuple[int, ...] = 0
    resume: str = ""  # a checkpoint (ckpt_<i>.json/.npz, or a directory: its latest) to continue from

    @staticmethod
    def from_kwargs(kwargs: Mapping[str, Any]) -> CompileOptions:
        names = {f.name for f in fields(CompileOptions)}
        bad = sorted(set(kwargs) - names)
        if bad:
            raise TimeRLError(f"unknown compile option(s) {bad}; valid options: {sorted(names)}")
        return CompileOptions(**kwargs)

    def __post_init__(self) -> None:
        if self.compile_iterations not in (True, False, "auto"):
            raise TimeRLError(f"compile_iterations={self.compile_iterations!r}: use True, False or 'auto'")
        object.__setattr__(self, "max_bounds", _named_maxima(self.max_bounds))
        if not isinstance(self.seed, numbers.Integral):
            object.__setattr__(self, "seed", tuple(int(x) for x in self.seed))

    @property
    def base_seed(self) -> int:
        """The seed, or the first agent's (``seed`` given per agent)."""
        return int(self.seed) if isinstance(self.seed, numbers.Integral) else self.seed[0]


def _named_maxima(given: Any) -> tuple[tuple[str, int], ...]:
    """``max_bounds`` as sorted ``(bound name, most)`` pairs (hashable; checked: positive ints)."""
    pairs = given.items() if isinstance(given, Mapping) else given
    out: dict[str, int] = {}
    for key, most in pairs:
        name = key if isinstance(key, str) else getattr(key, "name", None)
        if not isinstance(name, str):
            raise TimeRLError(
                f"max_bounds: {key!r} is not a bound; use the symbol of a dynamic bound ({{T: 1000}})"
            )
        if isinstance(most, bool) or not isinstance(most, numbers.Integral) or most < 1:
            raise TimeRLError(f"max_bounds[{name}] = {most!r}: give the most {name} can reach, an int >= 1")
        out[name] = int(most)
    return tuple(sorted(out.items()))


class Executor:
    """A compiled program. ``execute()`` runs it once over all its points.

    ``plan`` is what runs (:class:`~timerl.plan.plan.Plan`: regions, donations, store kinds,
    scanned loops, the peak estimate); ``plan.pretty()`` lists it."""

    def __init__(
        self,
        pdg: PDG,
        schedule: Any,
        backend: Any,
        options: CompileOptions,
        resume: Any = None,
        plan: Any = None,
    ) -> None:
        from timerl.plan.iterations import checkpoint_sinks
        from timerl.runtime.interpreter import Executor as _Interp

        self.pdg = pdg
        self.schedule = schedule
        self.backend = backend
        self.options = options
        self.plan = plan if plan is not None else make_plan_for(pdg, schedule, options, backend, resume)
        # compiled with explain_memory=True: what the peak is made of (plan/explain.py)
        self.memory_explanation: Any = None
        if checkpoint_sinks(pdg) or resume is not None:
            from timerl.runtime.checkpoint import CheckpointingExecutor

            config = {"options": {f.name: getattr(options, f.name) for f in fields(options)}}
            self._interp: Any = CheckpointingExecutor(
                self.plan,
                backend,
                seed=options.seed,
                memory_timeline=options.memory_timeline,
                resume=resume,
                config=config,
            )
        else:
            self._interp = _Interp(
                self.plan, backend, seed=options.seed, memory_timeline=options.memory_timeline
            )

    def execute(self) -> None:
        """Run the whole program (all iterations)."""
        self._interp.execute()

    @property
    def dispatches(self) -> int:
        """Statements run from Python so far in the current run: one per region, node or
        scanned loop entry (the iterations of a scanned loop run inside one compiled call)."""
        return self._interp.dispatches

    @property
    def iteration_body(self) -> str:
        """How the iteration loop's body ran in the last run: as one compiled call per
        iteration, or statement by statement, and why (``compile_iterations``)."""
        it = self._interp._iteration
        if it is None:
            return f"statement by statement: {self.plan.body}"
        return it.status

    def memory_stats(self, top: int = 10) -> Any:
        """Bytes held by the run's stores: live and peak, per pool and for the ``top`` largest
        tensors (:class:`~timerl.runtime.store.MemoryStats`)."""
        return self._interp.memory_stats(top)

    def memory_timeline(self) -> Any:
        """Live bytes per pool over the last run, sampled at every put and free
        (:class:`~timerl.runtime.store.MemoryTimeline`; the paper's Fig. 11a), or None
        unless compiled with ``memory_timeline=True``."""
        return self._interp.memory_timeline()

    def pretty(self) -> str:
        """The PDG and the schedule's AST, for debugging."""
        return f"{self.pdg.pretty()}\n\n{self.schedule.pretty()}"

    def plot_schedule(self, path: str | Path) -> tuple[Path, Path]:
        """A picture of the schedule: ``<path>.txt`` holds the loop nest (each loop named by
        the dim it walks) with the statements it runs in order, summarised by the source
        lines that defined them, then the full listing with every statement named;
        ``<path>.png`` draws the loop nest as nested boxes; the text ends with the Plan's
        listing (regions, donations, which loops compile as one scan and why the others do
        not, block-stored outputs). Returns both paths
        (:mod:`timerl.schedule.picture`)."""
        from timerl.schedule.picture import write_picture

        txt, png = write_picture(self.pdg, self.schedule.ast, path)
        with open(txt, "a") as f:  # what runs: regions, donations, scanned loops and why not
            f.write("\n\n" + self.plan.pretty() + "\n")
        return txt, png


def build_pdg(ctx: Context, bounds: Mapping[Any, Any], options: CompileOptions) -> PDG:
    """Lower the program and run the PDG passes selected by ``options``.

    The result is verified (``verify_pdg``); with ``TIMERL_VERIFY_PASSES=1`` (the test suite
    sets it) the PDG is verified after every pass too, naming the pass that broke it. Every
    read is checked to be defined (``check_reads``) once: before ``vectorize_time`` (which
    takes reads along the vectorized dim out of ``phi``), or at the end when it does not run."""
    import os

    from timerl.pdg.passes.dce import eliminate_dead_code
    from timerl.pdg.passes.enclose import enclose_dynamic_dims
    from timerl.pdg.passes.restrict import restrict_to_demand
    from timerl.pdg.passes.vectorize import vectorize
    from timerl.pdg.verify import sink_shapes, verify_pdg, verify_sink_shapes
    from timerl.rt.lower import lower
    from timerl.schedule.check import check_reads_defined

    each = os.environ.get("TIMERL_VERIFY_PASSES", "0") not in ("", "0")
    sinks: dict[int, Any] = {}

    def verified(p: PDG, after: str) -> PDG:
        if each:
            log.debug("verifying the PDG after %s", after)
            try:
                verify_pdg(p)
            except PDGError as exc:
                raise PDGError(f"after {after}: {exc}") from exc
            if sinks:  # every pass preserves the shape each sink receives
                verify_sink_shapes(p, sinks, after)
            sinks.update(sink_shapes(p))
        return p

    pdg = verified(lower(ctx, bounds), "lowering")
    # branch values only where the branch can be taken
    pdg = verified(restrict_to_demand(pdg), "restrict_to_demand")
    required = frozenset(s for n in ctx.graph.nodes.values() for s in n.batch_dims)
    if options.vectorize or required:
        pdg = verified(
            vectorize(pdg, None if options.vectorize else sorted(required, key=str), required), "vectorize"
        )
    if options.simplify:
        from timerl.pdg.passes.simplify import simplify

        pdg = verified(simplify(pdg), "simplify")
    if options.broadcast:
        from timerl.pdg.passes.broadcast import remove_broadcasts

        pdg = verified(remove_broadcasts(pdg), "remove_broadcasts")
    if options.cse:
        from timerl.pdg.passes.cse import eliminate_common_subexpressions

        pdg = verified(eliminate_common_subexpressions(pdg), "eliminate_common_subexpressions")
    if options.accumulate:  # before contract: the sums it rewrites are not contracted
        from timerl.pdg.passes.accumulate import accumulate_episode_sums

        pdg = verified(accumulate_episode_sums(pdg), "accumulate_episode_sums")
    if options.contract:
        from timerl.pdg.passes.contract import contract_outer_products

        pdg = verified(contract_outer_products(pdg), "contract_outer_products")
        if options.cse:  # the contractions of one operand (actor's and critic's first layer)
            pdg = verified(eliminate_common_subexpressions(pdg), "eliminate_common_subexpressions")
    if options.scan_lift:
        from timerl.pdg.passes.scan_lift import lift_scans

        pdg = verified(lift_scans(pdg), "lift_scans")
    if options.suffix_scan:
        from timerl.pdg.passes.suffix_scan import scan_suffix_sums

        pdg = verified(scan_suffix_sums(pdg), "scan_suffix_sums")
    if options.dce:
        keep = frozenset(n.id for n in ctx.graph.nodes.values() if n.is_param)
        pdg = verified(eliminate_dead_code(pdg, keep), "eliminate_dead_code")
    reads_checked = False
    if options.vectorize_time:
        from timerl.pdg.passes.vectorize_partial import vectorize_partial

        # the innermost dim, not counting agent dims (put last in the context, they are batch dims)
        timed = [d for d, _ in pdg.dims if not any(d is a for a in pdg.agent_dims)]
        inner = timed[-1] if timed else None
        if inner is not None and any(inner in n.domain for n in pdg):
            if options.check_reads:  # reads along vectorized dims are no longer in phi after it
                check_reads_defined(pdg)
                reads_checked = True
            # with swapping, learning reads an episode's swapped tensors one step at a time
            # (fetched per step); vectorized, it would read them whole, block-stored, unswapped
            dynamic = options.vectorize_dynamic and not options.swap
            if options.vectorize_dynamic and options.swap and pdg.bound_of(inner) in pdg.dynamic_bounds:
                log.info("swap=True: %s (dynamic bound) is not vectorized (vectorize_dynamic)", inner)
            if pdg.bound_of(inner) in pdg.dynamic_bounds and dynamic:
                # vectorized nodes need the dims enclosing the episodes (their T)
                pdg = verified(enclose_dynamic_dims(pdg), "enclose_dynamic_dims")
            stream = None
            if options.incrementalize is not None:  # memory first: reductions of big steps per step
                from timerl.pdg.passes.incrementalize import parse_threshold

                stream = parse_threshold(options.incrementalize)
            pdg = verified(vectorize_partial(pdg, inner, dynamic=dynamic, stream=stream), "vectorize_partial")
    if options.incrementalize is not None:
        from timerl.pdg.passes.incrementalize import incrementalize, parse_threshold

        pdg = verified(incrementalize(pdg, parse_threshold(options.incrementalize)), "incrementalize")
    if pdg.dynamic_bounds:  # a node over t alone has no single T when T is per episode
        pdg = verified(enclose_dynamic_dims(pdg), "enclose_dynamic_dims")
    if options.check_reads and (not reads_checked or pdg.dynamic_bounds):  # enclose widens reads
        check_reads_defined(pdg)
    verify_pdg(pdg)
    return pdg


def plan_options(options: CompileOptions) -> Any:
    """The :class:`~timerl.plan.plan.PlanOptions` of ``options`` (donation needs the frees)."""
    from timerl.plan.plan import PlanOptions
    from timerl.units import parse_bytes

    return PlanOptions(
        fuse=options.fuse,
        donate=options.donate and options.dealloc,
        scan_loops=options.scan_loops,
        compile_iterations=options.compile_iterations,
        free_iterations=options.free_iterations,
        block_store=options.block_store,
        memory_budget=None if options.memory_budget is None else parse_bytes(options.memory_budget),
        max_bounds=options.max_bounds,
    )


def make_plan_for(
    pdg: PDG, schedule: Any, options: CompileOptions, backend: Any, resume: Any = None, estimate: bool = False
) -> Any:
    """The Plan that runs ``schedule`` over ``pdg`` on ``backend`` with ``options``
    (``estimate``: made for its peak estimate only, without the merge moves)."""
    from timerl.plan.plan import Target, make_plan

    return make_plan(
        pdg,
        schedule.ast,
        plan_options(options),
        Target.of(backend),
        keep=kept_values(pdg),
        resume_after=None if resume is None else resume.iteration,
        with_moves=not estimate,
    )


def swapped_nodes(pdg: PDG, options: CompileOptions, threshold: int | None = None) -> frozenset[int]:
    """The nodes ``swap`` moves (``schedule/swap.swappable``): none unless ``options.swap``
    (or a ``threshold`` is given, by the budget); block-stored and checkpointed values
    excluded. Swapping needs the frees (``dealloc``)."""
    from timerl.schedule.swap import swappable
    from timerl.units import parse_bytes

    if threshold is None:
        if not options.swap:
            return frozenset()
        threshold = parse_bytes(options.swap_threshold) if options.swap_threshold else 0
    if not options.dealloc:
        log.warning(
            "swap needs dealloc (the free after a tensor's last consumer ends its swapping); not swapping"
        )
        return frozenset()
    exclude = set(kept_values(pdg))
    if options.block_store:
        from timerl.plan.storage import plan_block_storage

        blocks = plan_block_storage(pdg)  # a node with every output block-stored cannot move
        exclude |= {
            n.id for n in pdg if n.outputs and all((n.id, k) in blocks for k in range(len(n.outputs)))
        }
    return swappable(pdg, threshold, frozenset(exclude))


def compile_context(ctx: Context, bounds: Mapping[Any, Any], backend: str, **kwargs: Any) -> Executor:
    from timerl.backends import get_backend
    from timerl.schedule.scheduler import schedule_pdg

    options = CompileOptions.from_kwargs(kwargs)
    if options.resume:  # a missing path fails before any compile work
        from timerl.runtime.checkpoint import pick_checkpoint

        pick_checkpoint(str(options.resume))
    t0 = time.perf_counter()
    be = get_backend(backend)
    budget = None
    if options.memory_budget is not None:
        from timerl.units import parse_bytes

        budget = parse_bytes(options.memory_budget)  # a bad size fails before any compile work
    pdg = build_pdg(ctx, bounds, options)  # verified, reads checked
    _check_max_bounds(pdg, options)
    sched = schedule_pdg(
        pdg,
        dealloc=options.dealloc,
        keep=kept_values(pdg) if options.dealloc else frozenset(),
        swap=swapped_nodes(pdg, options),
    )
    if budget is not None:

        def rebuild_with(opts: CompileOptions) -> PDG:
            return build_pdg(ctx, bounds, opts)

        from timerl.fit_budget import fit_budget

        pdg, sched, options = fit_budget(pdg, sched, options, budget, be, rebuild_with)
    explanation = _explain(ctx, bounds, pdg, sched, options, be) if options.explain_memory else None
    if options.peel:
        from timerl.schedule.peel import peel_ifs

        sched = replace(sched, ast=peel_ifs(sched.ast, frozenset(pdg.dynamic_bounds)))
    for n in pdg:
        if n.op.kind is OpKind.UDF:
            n.op.attr("fn").bind(pdg.static_bounds)
    resume = None
    if options.resume:
        from timerl.runtime.checkpoint import load_checkpoint

        resume = load_checkpoint(str(options.resume), pdg, options.base_seed)
    log.info("compiled %d nodes, %d edges in %.2fs", len(pdg.nodes), len(pdg.edges), time.perf_counter() - t0)
    ex = Executor(pdg, sched, be, options, resume)
    ex.memory_explanation = explanation
    return ex


def _check_max_bounds(pdg: PDG, options: CompileOptions) -> None:
    """``max_bounds`` names dynamic bounds only (a static bound is known already)."""
    dynamic = sorted(s.name for s in pdg.dynamic_bounds)
    for name, _ in options.max_bounds:
        if name not in dynamic:
            static = name in {s.name for s in pdg.static_bounds}
            raise TimeRLError(
                f"max_bounds[{name}]: {name} is {'a static bound (its value is given)' if static else 'not a bound of the program'}; "
                f"max_bounds takes the dynamic bounds (ended by a done-signal): {', '.join(dynamic) or 'none here'}"
            )


def _explain(
    ctx: Context, bounds: Mapping[Any, Any], pdg: PDG, sched: Any, options: CompileOptions, backend: Any
) -> Any:
    """``explain_memory``: the :class:`~timerl.plan.explain.MemoryExplanation` of the chosen
    schedule, logged at INFO; with growing tensors, the schedules ``memory_budget`` tries are
    built to say which would bound them."""
    from timerl.fit_dynamic import try_growths
    from timerl.plan.explain import explain
    from timerl.plan.peak import dynamic_growth

    plan = make_plan_for(pdg, sched, options, backend, estimate=True)
    growth = dynamic_growth(plan)
    tries = []
    if growth is not None and growth.grows:
        tries = try_growths(pdg, sched, options, backend, lambda opts: build_pdg(ctx, bounds, opts))
    out = explain(plan.peak, pdg, growth, tries)
    log.info("%s", out.describe())
    return out

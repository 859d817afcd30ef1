"""A measurement farm on Ray: compile-and-time measurements as calls to worker actors.

``trl.dist.ray_farm(address=..., num_workers=N)`` makes the configuration; an env that
measures (``looptune.*``, ``tiramisu.*``, RELEASE's tuner) takes it as ``farm=`` and wraps
its measurer (:mod:`timerl.dist.measurers`). :meth:`RayFarm.start` connects to the cluster
(an unreachable address fails there, before anything compiles) and starts ``N`` worker
actors, one Ray CPU each, spread over the nodes.

- **One timing per physical core at a time, pinned**: each worker pins its process to one
  physical core of its node (``os.sched_setaffinity``), claimed with a lock file that the
  process holds while it lives (:func:`claim_core`), so two workers of a node never time on
  the same core; a worker measures one thing at a time.
- **Compiled artefacts cached per worker**: a worker keeps the measurer it made (its
  built kernels, inputs and in-memory cache) for the run.
- **Results to the driver**: :meth:`Farm.run` sends a batch of calls out at once (one per
  free worker), gathers them in order; the driver-side measurer writes the measurement
  cache, once per key.
- **Faults**: a worker lost mid-call (``RayActorError``: its process killed, its node gone)
  is replaced by a new actor and its call retried on the next free worker, with a WARNING;
  :attr:`Farm.stats` counts retries and replacements. A call lost ``max_retries`` times in
  a row raises :class:`DistributedError`.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from timerl.dist.cluster import connect
from timerl.errors import DistributedError

log = logging.getLogger("timerl.dist")

CORE_LOCK_DIR = Path(tempfile.gettempdir()) / "timerl-farm-cores"


@dataclasses.dataclass(frozen=True)
class FarmStats:
    """What a farm did so far."""

    num_workers: int
    calls: int  # calls answered (each measured once; retried calls count once)
    retries: int  # calls sent again because their worker was lost
    replacements: int  # workers lost and replaced


@dataclasses.dataclass(frozen=True)
class RayFarm:
    """Where and how many measurement workers; see :func:`ray_farm`."""

    address: str | None = None
    num_workers: int | None = None
    max_retries: int = 3
    pin: bool = True
    cpus_per_worker: float = 1.0
    call_timeout_s: float | None = 600.0

    def start(self) -> Farm:
        """The running farm of this configuration (started on first use, then shared by
        every env and measurer of this process that uses the same configuration)."""
        farm = _LIVE.get(self)
        if farm is None or not farm.alive or not farm.ray.is_initialized():
            farm = Farm(self)
            _LIVE[self] = farm
        return farm

    def looptune_measurer(self, spec: Any = "tvm", cache_dir: str | os.PathLike[str] | None = None) -> Any:
        """A LoopTune measurer (``gflops``/``gflops_many``) that measures on this farm."""
        from timerl.dist.measurers import LoopTuneFarmMeasurer

        return LoopTuneFarmMeasurer(self.start(), spec, cache_dir)

    def tiramisu_measurer(self, **kwargs: Any) -> Any:
        """A Tiramisu measurer (``measure``/``measure_many``) that measures on this farm."""
        from timerl.dist.measurers import TiramisuFarmMeasurer

        return TiramisuFarmMeasurer(self.start(), **kwargs)

    def release_measurer(self, **kwargs: Any) -> Any:
        """A RELEASE measurer (``measure``/``measure_many``) that measures on this farm."""
        from timerl.dist.measurers import ReleaseFarmMeasurer

        return ReleaseFarmMeasurer(self.start(), **kwargs)


def ray_farm(
    address: str | None = None,
    num_workers: int | None = None,
    *,
    max_retries: int = 3,
    pin: bool = True,
    cpus_per_worker: float = 1.0,
    call_timeout_s: float | None = 600.0,
) -> RayFarm:
    """A measurement farm on a Ray cluster, for ``trl.env.make("looptune.mm", farm=...)``,
    ``trl.env.make("tiramisu.<set>", farm=...)`` and RELEASE's ``tune(..., farm=...)``.

    :param address: the cluster (``"host:port"`` as ``ray start --head`` prints, ``"auto"``),
        or ``None`` for a Ray instance on this machine (started if none runs in this process).
    :param num_workers: measurement workers (``None``: one per CPU the cluster offers, at
        ``cpus_per_worker`` each). Give the nodes as many CPUs as they have physical cores
        (``ray start --num-cpus=<cores>``) so that every worker gets a core of its own.
    :param max_retries: times one measurement is sent again after losing its worker.
    :param pin: pin each worker to a physical core of its own (see the module doc).
    :param cpus_per_worker: Ray CPUs each worker reserves.
    :param call_timeout_s: a call that has not answered after this many seconds counts as
        lost: its worker is killed and replaced, the call retried (``None``: wait forever).
    """
    if num_workers is not None and int(num_workers) < 1:
        raise DistributedError(f"ray_farm: num_workers must be at least 1, got {num_workers}")
    if max_retries < 0:
        raise DistributedError(f"ray_farm: max_retries must be >= 0, got {max_retries}")
    if call_timeout_s is not None and call_timeout_s <= 0:
        raise DistributedError(f"ray_farm: call_timeout_s must be > 0 or None, got {call_timeout_s}")
    n = None if num_workers is None else int(num_workers)
    return RayFarm(address, n, int(max_retries), bool(pin), float(cpus_per_worker), call_timeout_s)


def farm_from_flags(ray_address: str, farm_workers: int = 0) -> RayFarm | None:
    """The farm of the examples' ``--ray-address``/``--farm-workers`` flags: None for an
    empty address (measure in this process), a Ray started on this machine for ``local``."""
    if not ray_address:
        return None
    address = None if ray_address == "local" else ray_address
    return ray_farm(address, farm_workers if farm_workers > 0 else None)


_LIVE: dict[RayFarm, Farm] = {}


# --- the worker ---------------------------------------------------------------------------


def physical_cores(allowed: Sequence[int]) -> list[int]:
    """One logical CPU per physical core among ``allowed`` (the lowest of its hyperthreads),
    from ``/sys/devices/system/cpu/cpu*/topology``; ``allowed`` as is where that is missing."""
    seen: set[tuple[str, str]] = set()
    out = []
    for cpu in sorted(allowed):
        topo = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            core = (
                (topo / "physical_package_id").read_text().strip(),
                (topo / "core_id").read_text().strip(),
            )
        except OSError:
            core = ("", str(cpu))
        if core not in seen:
            seen.add(core)
            out.append(cpu)
    return out


def claim_core(lock_dir: Path = CORE_LOCK_DIR) -> tuple[int | None, Any]:
    """Pin this process to a physical core no other live farm worker of this machine holds:
    ``(cpu, lock)`` (keep ``lock`` open while the process lives; the lock goes with the
    process). Where every core is held, the process shares the first one (WARNING)."""
    cores = physical_cores(sorted(os.sched_getaffinity(0)))
    lock_dir.mkdir(parents=True, exist_ok=True)
    for cpu in cores:
        f = (lock_dir / f"cpu{cpu}.lock").open("a")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            continue
        os.sched_setaffinity(0, {cpu})
        return cpu, f
    if not cores:
        return None, None
    log.warning(
        "farm worker %d: all %d physical cores it may use (%s) hold a farm worker; sharing CPU %d "
        "(timings are noisier: start fewer workers or give the node more CPUs)",
        os.getpid(),
        len(cores),
        cores,
        cores[0],
    )
    os.sched_setaffinity(0, {cores[0]})
    return cores[0], None


class FarmWorker:
    """What a farm's Ray actor runs: measurers made on first use and kept, called on request."""

    def __init__(self, pin: bool) -> None:
        self.cpu, self._lock = claim_core() if pin else (None, None)
        if self.cpu is not None:  # one core: kernels time single-threaded
            for var in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                os.environ[var] = "1"
        self.measurers: dict[str, Any] = {}
        self.calls = 0

    def info(self) -> dict[str, Any]:
        """Where the worker runs: process id, Ray node id, the CPU it is pinned to."""
        import ray

        return {"pid": os.getpid(), "node": ray.get_runtime_context().get_node_id(), "cpu": self.cpu}

    def call(self, key: str, factory: Callable[[], Any], method: str, args: tuple[Any, ...]) -> Any:
        """``measurer.method(*args)`` (an attribute's value if not callable) on the measurer
        ``key``, made with ``factory()`` on first use."""
        m = self.measurers.get(key)
        if m is None:
            m = self.measurers[key] = factory()
        self.calls += 1
        v = getattr(m, method)
        return v(*args) if callable(v) else v


# --- the driver ---------------------------------------------------------------------------


class Farm:
    """The running workers of a :class:`RayFarm` (see the module doc)."""

    def __init__(self, config: RayFarm) -> None:
        self.ray = connect(config.address)  # fails here, naming the address, before any compile
        from ray.exceptions import ObjectLostError, RayActorError, RayTaskError, WorkerCrashedError

        self._lost = (RayActorError, WorkerCrashedError, ObjectLostError)
        self._task_error = RayTaskError
        self.config = config
        cpus = float(self.ray.cluster_resources().get("CPU", 0.0))
        per = config.cpus_per_worker
        n = config.num_workers if config.num_workers is not None else max(1, int(cpus // per))
        if n * per > cpus:
            raise DistributedError(
                f"measurement farm at {config.address!r}: {n} workers of {per:g} CPU need {n * per:g} CPUs, "
                f"the cluster has {cpus:g} (add nodes, or ask for fewer workers)"
            )
        self._actor_cls = self.ray.remote(FarmWorker)
        self.workers = [self._new_worker() for _ in range(n)]
        self.placement: list[dict[str, Any]] = list(self.ray.get([w.info.remote() for w in self.workers]))
        self.alive = True
        self._calls = 0
        self._retries = 0
        self._replacements = 0
        self._starting: dict[Any, int] = {}  # replacements not started yet: their info call -> index
        self._started: dict[Any, float] = {}  # ... and when they were made
        log.info("measurement farm: %d workers %s", n, [(p["node"][:8], p["cpu"]) for p in self.placement])

    def _new_worker(self) -> Any:
        return self._actor_cls.options(
            num_cpus=self.config.cpus_per_worker, max_restarts=0, scheduling_strategy="SPREAD"
        ).remote(self.config.pin)

    @property
    def stats(self) -> FarmStats:
        return FarmStats(len(self.workers), self._calls, self._retries, self._replacements)

    def run(
        self, key: str, factory: Callable[[], Any], method: str, calls: Sequence[tuple[Any, ...]]
    ) -> list[Any]:
        """``measurer.method(*args)`` for each ``args`` of ``calls`` on the workers (the
        measurer ``key`` made by ``factory`` on each worker once), at most one call per
        worker at a time, all workers busy while calls remain; the results in ``calls``'
        order. A call whose worker is lost goes to the next worker that is free (the lost
        one's replacement takes calls once it has started; module doc)."""
        results: list[Any] = [None] * len(calls)
        pending = deque(range(len(calls)))
        idle = deque(w for w in range(len(self.workers)) if w not in self._starting.values())
        inflight: dict[Any, tuple[int, int]] = {}
        sent: dict[Any, float] = {}
        lost = [0] * len(calls)
        limit = self.config.call_timeout_s
        while pending or inflight:
            while pending and idle:
                w, j = idle.popleft(), pending.popleft()
                ref = self.workers[w].call.remote(key, factory, method, tuple(calls[j]))
                inflight[ref] = (w, j)
                sent[ref] = time.monotonic()
            clocks = {**sent, **{r: self._started[r] for r in self._starting}}
            wait_s = None if limit is None else max(0.0, min(clocks.values()) + limit - time.monotonic())
            ready, _ = self.ray.wait(list(clocks), num_returns=1, timeout=wait_s)
            late = None
            if not ready:  # the oldest call (or start) ran past call_timeout_s
                ready = [late := min(clocks, key=clocks.__getitem__)]
            for ref in ready:
                if ref in self._starting:  # a replacement: free once it has started
                    if ref is late:
                        raise DistributedError(
                            f"measurement farm: a replacement worker did not start within {limit:g} s "
                            "(no free CPU left in the cluster?)"
                        )
                    w = self._starting.pop(ref)
                    self._started.pop(ref)
                    try:
                        self.placement[w] = self.ray.get(ref)
                    except self._lost:
                        self._replace(w, "start", -1, len(calls))
                        continue
                    idle.append(w)
                    continue
                w, j = inflight.pop(ref)
                sent.pop(ref)
                try:
                    if ref is late:
                        raise TimeoutError(f"no answer after {limit:g} s")
                    results[j] = self.ray.get(ref)
                except (*self._lost, TimeoutError) as exc:
                    lost[j] += 1
                    if lost[j] > self.config.max_retries:
                        raise DistributedError(
                            f"measurement farm: call {j} of {len(calls)} ({method}) lost its worker "
                            f"{lost[j]} times: {exc}"
                        ) from exc
                    self._retries += 1
                    self._replace(w, method, j, len(calls))
                    pending.appendleft(j)  # to the next free worker
                    continue
                except self._task_error as exc:  # the measurer raised: raise it here
                    raise exc.as_instanceof_cause() from None
                self._calls += 1
                idle.append(w)
        return results

    def each(
        self, key: str, factory: Callable[[], Any], method: str, args: tuple[Any, ...] = ()
    ) -> list[Any]:
        """``measurer.method(*args)`` on every worker (e.g. a counter); lost workers are left out."""
        out = []
        for ref in [w.call.remote(key, factory, method, args) for w in self.workers]:
            try:
                out.append(self.ray.get(ref))
            except self._lost:
                continue
        return out

    def _replace(self, w: int, method: str, j: int, n: int) -> None:
        self._replacements += 1
        old = self.placement[w] if w < len(self.placement) else {}
        log.warning(
            "measurement farm: worker %d (pid %s, CPU %s) was lost during %s of call %d of %d; replacing "
            "it, the call goes to the next free worker (retry %d, replacement %d)",
            w,
            old.get("pid"),
            old.get("cpu"),
            method,
            j,
            n,
            self._retries,
            self._replacements,
        )
        try:
            self.ray.kill(self.workers[w])
        except Exception:  # already gone
            pass
        self.workers[w] = self._new_worker()
        self.placement[w] = {"pid": None, "node": "", "cpu": None}  # known once it has started
        ref = self.workers[w].info.remote()
        self._starting[ref] = w
        self._started[ref] = time.monotonic()

    def refresh_placement(self, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """Ask every worker where it runs (after replacements)."""
        t = time.perf_counter()
        self.placement = list(self.ray.get([w.info.remote() for w in self.workers], timeout=timeout_s))
        log.debug("farm placement in %.2f s: %s", time.perf_counter() - t, self.placement)
        return self.placement

    def close(self) -> None:
        """Kill the workers; the configuration's next :meth:`RayFarm.start` starts new ones."""
        for w in self.workers:
            try:
                self.ray.kill(w)
            except Exception:  # already gone
                pass
        self.workers = []
        self._starting.clear()
        self._started.clear()
        self.alive = False
        if _LIVE.get(self.config) is self:
            del _LIVE[self.config]

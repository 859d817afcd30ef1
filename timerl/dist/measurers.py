"""Driver-side measurers that measure on a :class:`~timerl.dist.farm.Farm`.

Each has the interface of the measurer it stands in for (LoopTune's ``gflops``, Tiramisu's
``measure``/``seconds``/``cached``/``records``/``base_seconds``, RELEASE's ``measure``), so
the envs and tuners use it as they use a local one, plus a batch method (``gflops_many``,
``measure_many``) that the envs call with one step's ``B`` measurements so that they go out
at once. Each worker makes the real measurer once (no disk cache of its own: its compiled
kernels and in-memory cache stay for the run); the driver keeps the results in memory and
writes the measurement cache file (the same file and format as the local measurer's) once
per key: a key already cached, or asked twice in one batch, is measured once.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from timerl.dist.farm import Farm
from timerl.errors import DistributedError, TimeRLError

log = logging.getLogger("timerl.dist")


def _same(obj: Any) -> Any:
    return obj


def _measure_missing(
    farm: Farm,
    key: str,
    factory: Callable[[], Any],
    method: str,
    items: Sequence[tuple[str, tuple[Any, ...]]],
    known: Callable[[str], bool],
) -> dict[str, Any]:
    """Measure on ``farm`` the items whose key is not ``known``, each distinct key once."""
    todo: dict[str, tuple[Any, ...]] = {}
    for k, args in items:
        if k not in todo and not known(k):
            todo[k] = args
    if not todo:
        return {}
    values = farm.run(key, factory, method, list(todo.values()))
    return dict(zip(todo, values, strict=True))


class LoopTuneFarmMeasurer:
    """LoopTune's :class:`~timerl.envs.looptune.measure.Measurer` on a farm.

    ``spec``: ``"tvm"`` (:class:`~timerl.envs.looptune.measure.TVMMeasurer` on each worker,
    results appended to the TVM disk cache of the workers' CPU under ``cache_dir``),
    ``"analytic"``, or a picklable measurer object (copied to each worker). ``peak`` (the
    denominator of LoopTune's rewards): the analytic model's for ``"analytic"``; for ``"tvm"``
    the workers' (:func:`~timerl.envs.looptune.measure.machine_peak` on every worker, the
    largest; measured once per CPU and kept in the peak cache under ``cache_dir`` when given,
    a path every node can reach, else the workers' default cache), on first use; else the
    measurer object's ``peak`` attribute, or None (the env measures this machine's)."""

    def __init__(
        self,
        farm: Farm,
        spec: Any = "tvm",
        cache_dir: str | os.PathLike[str] | None = None,
        disk_cache: bool = True,
    ) -> None:
        from timerl.envs.looptune.measure import AnalyticCostModel, MeasureStats, TVMMeasurer, _DiskCache

        self.farm = farm
        self._peak: float | None = None
        self._workers_peak = spec == "tvm"
        self._cache_dir = None if cache_dir is None else str(cache_dir)
        self.canonical = False
        if spec == "tvm":
            self.factory: Callable[[], Any] = functools.partial(TVMMeasurer, disk_cache=False)
            self.key, self.name, self.canonical = "looptune.tvm", "tvm", True
        elif spec == "analytic":
            self.factory, self.key, self.name = AnalyticCostModel, "looptune.analytic", "analytic"
            self._peak = AnalyticCostModel().peak
        elif isinstance(spec, str):
            raise TimeRLError(
                f"unknown LoopTune measurer {spec!r}; use 'tvm', 'analytic' or a Measurer object"
            )
        else:
            self.factory = functools.partial(_same, spec)
            self.key, self.name = f"looptune.{type(spec).__name__}.{id(spec)}", str(spec.name)
            self._peak = getattr(spec, "peak", None)
        self.stats = MeasureStats()
        self.writes: dict[str, int] = {}  # per key, results written to the cache (1 each)
        self._mem: dict[str, float] = {}
        self.disk: _DiskCache | None = None
        if disk_cache and spec == "tvm":
            from timerl.envs.looptune.measure import default_cache_dir

            (fname,) = farm.run(self.key, self.factory, "cache_file_name", [()])
            folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            self.disk = _DiskCache(folder / fname)
            log.info("LoopTune farm cache %s (%d entries)", self.disk.path, len(self.disk.values))

    @property
    def peak(self) -> float | None:
        """The rewards' denominator in GFLOPS (class doc); the workers' peak is measured on
        the first read."""
        if self._peak is None and self._workers_peak:
            peaks = self.farm.each(self.key, self.factory, "machine_peak", (self._cache_dir,))
            if not peaks:
                raise DistributedError("LoopTune farm: no worker answered for its machine peak")
            self._peak = max(float(p) for p in peaks)
            log.info("LoopTune farm: peak %.1f GFLOPS (the largest of %d workers')", self._peak, len(peaks))
        return self._peak

    def _key(self, state: Any) -> str:
        from timerl.envs.looptune.ir import canonical

        return canonical(state).schedule_key if self.canonical else state.schedule_key

    def gflops(self, state: Any) -> float:
        return self.gflops_many([state])[0]

    def gflops_many(self, states: Sequence[Any]) -> list[float]:
        """The GFLOPS of every state; those not cached measured at once on the farm."""
        keys = [self._key(s) for s in states]
        for k in keys:
            if k not in self._mem and self.disk is not None and k in self.disk.values:
                self.stats.disk_hits += 1
                self._mem[k] = self.disk.values[k]
        t = time.perf_counter()
        new = _measure_missing(
            self.farm,
            self.key,
            self.factory,
            "gflops",
            list(zip(keys, [(s,) for s in states], strict=True)),
            self._mem.__contains__,
        )
        if new:
            self.stats.total_s.append(time.perf_counter() - t)
        for k, v in new.items():
            self._mem[k] = float(v)
            self.stats.measured += 1
            self.writes[k] = self.writes.get(k, 0) + 1
            if self.disk is not None:
                self.disk.add(k, float(v))
        self.stats.memory_hits += len(keys) - len(new)
        return [self._mem[k] for k in keys]


class TiramisuFarmMeasurer:
    """The Tiramisu :class:`~timerl.envs.tiramisu.measure.Measurer` on a farm: each worker
    runs one with ``threads`` OpenMP threads (default 1: a worker owns one core) and its
    binaries in a temporary folder; the driver keeps the measurements and appends them to
    ``<cache_dir>/measurements-<threads>t[-cpu].jsonl`` (the local measurer's file)."""

    def __init__(
        self,
        farm: Farm,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = 1,
        disk_cache: bool = True,
        clock: str = "auto",
        **kwargs: Any,
    ) -> None:
        from timerl.envs.tiramisu.measure import Measurement, Measurer, default_cache_dir

        self.farm = farm
        self.threads = int(threads or 1)
        opts = dict(kwargs, threads=self.threads, disk_cache=False, clock=clock)
        self.factory = functools.partial(Measurer, **opts)
        self.key = "tiramisu." + json.dumps(opts, sort_keys=True, default=str)
        self.cpu_clock = clock == "cpu" or (clock == "auto" and self.threads == 1)
        self._mem: dict[str, Any] = {}
        self._base: dict[str, float] = {}
        self.writes: dict[str, int] = {}
        self.measured = 0
        self.seconds_spent = 0.0
        self.source_hits = 0
        self._db: Path | None = None
        if disk_cache:
            folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
            folder.mkdir(parents=True, exist_ok=True)
            self._db = folder / f"measurements-{self.threads}t{'-cpu' if self.cpu_clock else ''}.jsonl"
            if self._db.exists():
                for line in self._db.read_text().splitlines():
                    try:
                        rec = json.loads(line)
                        m = Measurement(
                            float(rec["seconds"]), rec.get("error", ""), float(rec.get("base", math.nan))
                        )
                    except (ValueError, KeyError, TypeError):
                        continue
                    self._mem[rec["key"]] = m

    @property
    def compiles(self) -> int:
        """gcc runs of the workers alive now."""
        return int(sum(self.farm.each(self.key, self.factory, "compiles")))

    @property
    def runs(self) -> int:
        """Runs of measured binaries on the workers alive now."""
        return int(sum(self.farm.each(self.key, self.factory, "runs")))

    def measure(self, sched: Any) -> Any:
        return self.measure_many([sched])[0]

    def measure_many(self, scheds: Sequence[Any]) -> list[Any]:
        """The measurement of every schedule; those not cached measured at once on the farm."""
        keys = [f"{s.key}@{self.threads}" for s in scheds]
        t = time.perf_counter()
        new = _measure_missing(
            self.farm,
            self.key,
            self.factory,
            "measure",
            list(zip(keys, [(s,) for s in scheds], strict=True)),
            self._mem.__contains__,
        )
        self.seconds_spent += time.perf_counter() - t if new else 0.0
        for k, m in new.items():
            self._mem[k] = m
            self.measured += 1
            self.writes[k] = self.writes.get(k, 0) + 1
            if self._db is not None:
                rec = {"key": k, "seconds": m.seconds, "error": m.error, "src": "", "base": m.base}
                with self._db.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
        return [self._mem[k] for k in keys]

    def seconds(self, sched: Any) -> float:
        return self.measure(sched).seconds

    def cached(self, sched: Any) -> Any:
        return self._mem.get(f"{sched.key}@{self.threads}")

    def records(self) -> dict[str, Any]:
        return dict(self._mem)

    def base_seconds(self, program: Any) -> float:
        """The untransformed program's median seconds, as a worker measured it (once)."""
        if program.uid not in self._base:
            (self._base[program.uid],) = self.farm.run(self.key, self.factory, "base_seconds", [(program,)])
        return self._base[program.uid]


class ReleaseFarmMeasurer:
    """RELEASE's :class:`~timerl.envs.release.measure.TemplateMeasurer` on a farm (its keyword
    arguments but ``table`` go to each worker's), or ``measurer``, a picklable object with
    ``measure(space, cfg)`` copied to each worker; ``table``: a
    :class:`~timerl.envs.release.measure.MeasurementTable` path the driver answers from and
    appends to (once per configuration; TemplateMeasurer only)."""

    def __init__(
        self, farm: Farm, table: str | os.PathLike[str] | None = None, measurer: Any = None, **kwargs: Any
    ) -> None:
        from timerl.envs.release.measure import MeasurementTable, TemplateMeasurer

        self.farm = farm
        if measurer is not None:
            self.factory: Callable[[], Any] = functools.partial(_same, measurer)
            self.key = f"release.{type(measurer).__name__}.{id(measurer)}"
        else:
            self.factory = functools.partial(TemplateMeasurer, **kwargs)
            self.key = "release." + json.dumps(kwargs, sort_keys=True, default=str)
        self._cache: dict[tuple, Any] = {}
        self.writes: dict[tuple, int] = {}
        self.measured = 0
        self.asks = 0
        self.table_hits = 0
        self.table = None
        if table is not None:
            (settings,) = farm.run(self.key, self.factory, "settings", [()])
            self.table = MeasurementTable(table, settings)

    @property
    def failures(self) -> int:
        return sum(not m.valid for m in self._cache.values())

    def measure(self, space: Any, cfg: Any) -> Any:
        return self.measure_many(space, [cfg])[0]

    def measure_many(self, space: Any, cfgs: Sequence[Any]) -> list[Any]:
        """The measurement of every configuration; those not cached measured at once on the farm."""
        keys = [(space.layer, tuple(c)) for c in cfgs]
        self.asks += len(keys)
        for k in keys:
            if k not in self._cache and self.table is not None:
                hit = self.table.get(space.layer, k[1])
                if hit is not None:
                    self.table_hits += 1
                    self._cache[k] = hit
        skeys = [repr(k) for k in keys]
        new = _measure_missing(
            self.farm,
            self.key,
            self.factory,
            "measure",
            list(zip(skeys, [(space, c) for c in cfgs], strict=True)),
            lambda s: keys[skeys.index(s)] in self._cache,
        )
        for k in keys:
            m = new.get(repr(k))
            if m is None or k in self._cache:
                continue
            self._cache[k] = m
            self.measured += 1
            self.writes[k] = self.writes.get(k, 0) + 1
            if self.table is not None:
                self.table.add(space.layer, m)
        return [self._cache[k] for k in keys]

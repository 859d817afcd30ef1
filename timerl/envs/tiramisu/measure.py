"""Compile, check and time schedules.

:class:`Measurer` turns a schedule into C (:mod:`.codegen`), compiles it with
``gcc -O3 -march=native -fopenmp`` (binaries cached on disk by the hash of the source
and flags), runs it once to compare the output arrays with the untransformed program's
(``rtol`` relative to the largest reference value), then takes the median of ``reps``
timed runs. Results are cached in memory and in a JSON-lines file keyed by the
schedule key and the thread count, and by the hash of the generated program: schedules
that isl turns into the same C code (tiles larger than their loops, ...) share one
measurement instead of being compiled and timed again, and one whose kernel is the
untransformed one measures the untransformed time. A schedule that fails to compile,
crashes, times out or computes a wrong result measures ``inf`` seconds and is logged
(never raised): the environment penalises it.

Timing rules (``shared/notes/loop_envs.md``): one measuring process at a time, and
enough repeats that a run's total is ~0.1 s (3..15 repeats).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from timerl.envs.tiramisu.codegen import kernel_c, program_c
from timerl.envs.tiramisu.program import Program
from timerl.envs.tiramisu.schedule import Schedule, initial_schedule
from timerl.errors import TimeRLError

__all__ = ["CFLAGS", "Measurement", "Measurer", "default_cache_dir"]

log = logging.getLogger("timerl.envs.tiramisu")

CFLAGS = ("-O3", "-march=native", "-fopenmp")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/timerl/tiramisu`` (``~/.cache/timerl/tiramisu`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "timerl" / "tiramisu"


@dataclass(frozen=True)
class Measurement:
    """Median seconds of a schedule (``inf`` when it failed) and why it failed."""

    seconds: float
    error: str = ""
    base: float = math.nan  # the untransformed program's seconds it was scaled by (nan: unknown)

    @property
    def speedup(self) -> float:
        """``base / seconds`` (nan when the base is unknown, 0 for a failure)."""
        return self.base / self.seconds if self.ok else 0.0

    @property
    def ok(self) -> bool:
        return math.isfinite(self.seconds)


class Measurer:
    """Compile-and-time measurer with caches (see the module doc).

    ``threads``: OpenMP threads of the measured programs (default: the CPU count);
    ``disk_cache``: keep binaries and measurements under ``cache_dir`` across runs.
    ``clock``: ``wall`` (``CLOCK_MONOTONIC``), ``cpu`` (the process's CPU time: a serial
    kernel preempted on a loaded machine does not accrue it, so a 1 ms kernel that runs
    within one time slice is not favoured over a 40 ms one that is preempted; wrong for
    parallel runs, which sum their threads), or ``auto``: ``cpu`` with one thread, else
    ``wall``. CPU-time measurements have their own disk cache file.
    """

    def __init__(
        self,
        cache_dir: str | os.PathLike[str] | None = None,
        threads: int | None = None,
        disk_cache: bool = True,
        rtol: float = 1e-3,
        timeout: float = 60.0,
        target_seconds: float = 0.1,
        clock: str = "auto",
    ) -> None:
        if shutil.which("gcc") is None:
            raise TimeRLError("the Tiramisu environment compiles with gcc, which is not on PATH")
        self.threads = int(threads or os.cpu_count() or 1)
        if clock not in ("auto", "wall", "cpu"):
            raise TimeRLError(f"Measurer: clock must be auto, wall or cpu, got {clock!r}")
        self.cpu_clock = clock == "cpu" or (clock == "auto" and self.threads == 1)
        self.clock = "CLOCK_PROCESS_CPUTIME_ID" if self.cpu_clock else "CLOCK_MONOTONIC"
        self.disk_cache = disk_cache
        self.dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._tmp = None if disk_cache else tempfile.TemporaryDirectory(prefix="timerl-tiramisu-")
        if self._tmp is not None:
            self.dir = Path(self._tmp.name)
        (self.dir / "bin").mkdir(parents=True, exist_ok=True)
        self.rtol = rtol
        self.timeout = timeout
        self.target_seconds = target_seconds
        self._mem: dict[str, Measurement] = {}
        self._by_src: dict[str, Measurement] = {}  # source hash @ threads -> measurement
        self.source_hits = 0
        self._refs: dict[str, np.ndarray] = {}
        self._base: dict[str, float] = {}
        self.compiles = 0
        self.runs = 0
        self.seconds_spent = 0.0
        self._db = self.dir / f"measurements-{self.threads}t{'-cpu' if self.cpu_clock else ''}.jsonl"
        if disk_cache and self._db.exists():
            for line in self._db.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    m = Measurement(
                        float(rec["seconds"]), rec.get("error", ""), float(rec.get("base", math.nan))
                    )
                    self._mem[rec["key"]] = m
                    if rec.get("src"):
                        self._by_src[rec["src"]] = m
                except (ValueError, KeyError):
                    continue

    # -- compile and run ---------------------------------------------------------------
    @staticmethod
    def _hash(src: str) -> str:
        return hashlib.sha256((src + " ".join(CFLAGS)).encode()).hexdigest()[:24]

    def compile(self, sched: Schedule, baseline: Schedule | None = None, src: str | None = None) -> Path:
        """The binary of ``sched`` (timed against ``baseline`` if given; ``src``: its
        :func:`program_c` if already made; compiled unless cached). Raises TimeRLError on failure."""
        src = program_c(sched, baseline, self.clock) if src is None else src
        h = self._hash(src)
        exe = self.dir / "bin" / f"{sched.program.uid}-{h}"
        if exe.exists():
            return exe
        with tempfile.TemporaryDirectory(prefix="timerl-tiramisu-cc-") as tmp:
            c = Path(tmp) / "prog.c"
            c.write_text(src)
            out = Path(tmp) / "prog"
            res = subprocess.run(
                ["gcc", *CFLAGS, "-o", str(out), str(c)], capture_output=True, text=True, timeout=120
            )
            self.compiles += 1
            if res.returncode != 0:
                raise TimeRLError(f"gcc failed on {sched.key}: {res.stderr[-2000:]}")
            shutil.move(str(out), exe)
        return exe

    def _run(self, exe: Path, reps: int) -> tuple[np.ndarray, np.ndarray]:
        """``(output arrays, times)``; times ``(reps,)`` or ``(reps, 2)`` (baseline, sched)."""
        with tempfile.TemporaryDirectory(prefix="timerl-tiramisu-run-") as tmp:
            outf = Path(tmp) / "out.bin"
            env = dict(os.environ, OMP_NUM_THREADS=str(self.threads), OMP_WAIT_POLICY="PASSIVE")
            res = subprocess.run(
                [str(exe), str(outf), str(reps)],
                capture_output=True,
                text=True,
                timeout=self.timeout,
                env=env,
            )
            self.runs += 1
            if res.returncode != 0:
                raise TimeRLError(f"{exe.name} exited with {res.returncode}: {res.stderr[-500:]}")
            data = np.fromfile(outf, dtype=np.float32)
        rows = [[float(v) for v in line.split()] for line in res.stdout.splitlines() if line.strip()]
        if len(rows) != reps:
            raise TimeRLError(f"{exe.name} printed {len(rows)} timings, expected {reps}")
        return data, np.asarray(rows).squeeze(-1) if rows and len(rows[0]) == 1 else np.asarray(rows)

    def reference(self, program: Program) -> np.ndarray:
        """The untransformed program's output arrays (flattened, float32)."""
        if program.uid not in self._refs:
            exe = self.compile(initial_schedule(program))
            data, times = self._run(exe, 5)
            self._refs[program.uid] = data
            self._base[program.uid] = float(np.median(times))
        return self._refs[program.uid]

    def base_seconds(self, program: Program) -> float:
        """The untransformed program's median seconds (its first measurement)."""
        self.reference(program)
        return self._base[program.uid]

    def _reps(self, program: Program) -> int:
        base = max(self.base_seconds(program), 1e-4)
        return int(min(15, max(3, round(self.target_seconds / base))))

    def measure(self, sched: Schedule) -> Measurement:
        """Normalised median seconds of ``sched`` (cached; module doc), ``inf`` with the
        reason on failure."""
        key = f"{sched.key}@{self.threads}"
        hit = self._mem.get(key)
        if hit is not None:
            return hit
        t0 = time.perf_counter()
        initial = initial_schedule(sched.program)
        src_key = ""
        try:
            ref = self.reference(sched.program)
            src = program_c(sched, initial, self.clock) if sched.key != initial.key else ""
            src_key = f"{self._hash(src)}@{self.threads}" if src else ""
            base = self._base[sched.program.uid]
            if not src or kernel_c(sched) == kernel_c(initial):  # the untransformed code
                m = Measurement(base, base=base)
                if src:
                    self.source_hits += 1
            elif src_key in self._by_src:
                m = self._by_src[src_key]
                self.source_hits += 1
            else:
                exe = self.compile(sched, baseline=initial, src=src)
                data, times = self._run(exe, self._reps(sched.program))
                scale = float(np.max(np.abs(ref))) if ref.size else 1.0
                if data.shape != ref.shape or not np.allclose(
                    data, ref, rtol=self.rtol, atol=self.rtol * scale
                ):
                    err = float(np.max(np.abs(data - ref))) if data.shape == ref.shape else float("nan")
                    raise TimeRLError(f"wrong result (max abs error {err:.3g}, reference scale {scale:.3g})")
                ratio = float(np.median(times[:, 1] / times[:, 0]))
                m = Measurement(ratio * base, base=base)
        except (TimeRLError, subprocess.TimeoutExpired, OSError) as e:
            log.warning("schedule %s failed: %s", sched.key, e)
            m = Measurement(math.inf, str(e)[:300])
        self.seconds_spent += time.perf_counter() - t0
        self._mem[key] = m
        if src_key:
            self._by_src.setdefault(src_key, m)
        if self.disk_cache:
            rec = {"key": key, "seconds": m.seconds, "error": m.error, "src": src_key, "base": m.base}
            with self._db.open("a") as f:
                f.write(json.dumps(rec) + "\n")
        return m

    def seconds(self, sched: Schedule) -> float:
        return self.measure(sched).seconds

    def cached(self, sched: Schedule) -> Measurement | None:
        """The measurement of ``sched`` if it is in the cache (by schedule key), else None."""
        return self._mem.get(f"{sched.key}@{self.threads}")

    def records(self) -> dict[str, Measurement]:
        """Every cached measurement by ``key@threads`` (disk records and this process's)."""
        return dict(self._mem)

"""Hardware measurements of configurations: build with TVM, check against NumPy, time.

:class:`TemplateMeasurer` builds a configuration (:mod:`.template`) for this CPU
(:func:`timerl.envs.looptune.tvm_lower.host_target`), runs it once on fixed random inputs
and compares the result with the float64 NumPy reference of the layer, then times it
single-threaded. The timing rule has two settings (:func:`time_call`): the **clock** --
``"wall"``, TVM's ``time_evaluator`` (the LoopTune measurer's rule,
:func:`timerl.envs.looptune.measure.best_seconds`), or ``"cpu"``, the process's CPU time
(``time.process_time_ns``) around the same calls, which does not count the time the kernel
spends descheduled while other processes run on a shared machine -- and the
**estimator** over the repeats (``"min"``, the fastest, or ``"median"``).

The **timing thread** and **stack offsets**. Some configurations run up to 2x
faster or slower depending on where the kernel's stack frame lands: C2's configuration
``tile_f=8, tile_x=8`` (seed 0's second) runs at 66 GFLOPS when the stack pointer at the call
is 16 mod 32 bytes and at 45 when it is 0 mod 32, and at 27-31 at some offsets mod 4 KiB
(C12's ``tile_f=8, tile_y=7, tile_x=7, tile_rc=8, tile_rx=3``: 57 GFLOPS, 39 at one offset).
A process's main thread starts at a random stack offset (address randomisation), so timed
there such a configuration gets a speed drawn per process and fixed within it -- "two-speed"
configurations -- whatever the input buffers' or the loaded code's
addresses. So the measurer checks and times every configuration in a **fresh thread**
(``thread="fresh"``, the default; a new thread starts at the same stack offset every time)
and times it at several **stack offsets** (``stack_offsets``, default ``(0, 16, 32, 48)``
bytes below that start: one per 16-byte class modulo 64), keeping the fastest: one speed,
the configuration's best over the alignments, in every process. The offsets need a C
compiler (``cc``) once per machine for a four-line helper (:func:`padcall`); without one
the measurer times at offset 0 only and logs a warning. ``thread="caller"`` with
``stack_offsets=(0,)`` times in the calling thread at its own offset. The offsets share the timing budget:
each gets a quarter of the repeats (a fast kernel: 5 repeats of ~1 ms each instead of 20; a
kernel slower than ~5 ms: single calls, at least one per offset), and only the first offset
has an untimed warm-up call, so a configuration costs about what it did with one offset.

A configuration that fails to build or run, or computes a wrong result, is recorded
**invalid** with 0 GFLOPS and its error, logged as a warning, and never timed.

Results are cached per (layer, configuration) in memory: a tuner that asks again gets the
same :class:`Measurement` back (its ``seconds`` are those of the original measurement, so
a caller that shares one measurer between tuners can still charge each of them the real
cost).

The **measurement table** (opt-in: ``TemplateMeasurer(table=path)``,
``python -m timerl.envs.release.study --table PATH``) makes that cache persistent across processes: a
:class:`MeasurementTable` is a JSON-lines file with one record per (measurer settings, layer,
configuration) -- GFLOPS, valid or not, its error, and the seconds the measurement took. The
first time any process asks for a configuration it is measured for real (built, checked against
NumPy and timed exactly as without a table) and its record appended (and flushed); every later
ask, in this process or any later one, gets the recorded :class:`Measurement` back, charged the
recorded seconds as the in-memory cache charges them. Why: on a shared machine the same
configuration times differently from process to process (load, the 4 KiB stack effect), the
cost model is fitted on those timings, and the searches part, so the same code and seeds moved
a 10-seed comparison by 1.4-1.7x between two runs of the same code. On a
table every search, sampler and seed sees one fixed objective -- one real timing per
configuration, the tabulated-objective practice of tuner benchmarks -- so paired comparisons
differ only by the searches' own randomness, and later seeds are mostly lookups. Each value is
still a single real measurement (a timing taken under load stays in the table). The settings
(clock, estimator, timing thread, stack offsets, repeats, the target, the TVM version and a hash
of the template's source) are part of every record's key, so a table is never reused under
other settings: records written under other settings are kept in the file but ignored (logged).
A line that does not parse (a process killed mid-write leaves a truncated last line) is skipped
with a warning, and the next record starts on a new line.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from timerl.envs.looptune.measure import best_seconds, timing_plan
from timerl.envs.looptune.tvm_lower import host_target, import_tvm
from timerl.envs.release import template
from timerl.envs.release.space import Config, KnobSpace, Layer, LayerKind
from timerl.errors import TimeRLError

log = logging.getLogger("timerl.envs.release")


@dataclass(frozen=True)
class Measurement:
    """One measured configuration: GFLOPS (0.0 when invalid), the error of an invalid one,
    and the wall seconds the measurement took (build, check and timing)."""

    config: Config
    gflops: float
    valid: bool
    seconds: float
    error: str = ""


class Measurer(Protocol):
    """Anything that measures configurations of a space."""

    def measure(self, space: KnobSpace, cfg: Config) -> Measurement: ...


def layer_inputs(layer: Layer, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Fixed random float32 inputs in [-1, 1) and the float64 NumPy reference output."""
    sa, sb, _ = layer.input_shapes()
    rng = np.random.default_rng([seed, *layer.sizes])
    a = rng.uniform(-1.0, 1.0, sa).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, sb).astype(np.float32)
    if layer.kind is LayerKind.CONV2D:  # the padding ring of the input is zero
        p = layer.sizes[5]
        if p:
            a[:, :p, :] = a[:, -p:, :] = 0.0
            a[:, :, :p] = a[:, :, -p:] = 0.0
    return a, b, layer.reference(a, b)


CLOCKS = ("wall", "cpu")
ESTIMATORS = ("min", "median")
THREADS = ("fresh", "caller")

_PADCALL_C = """
void timerl_padcall(long pad, void (*fn)(void)) {
  volatile char *p = __builtin_alloca(pad + 1);
  p[0] = 0;
  fn();
  p[0] = 1;
}
"""
_PADCALL_CB = ctypes.CFUNCTYPE(None)
_padcall_lib: list[Any] = []  # [the loaded helper, or None when it could not be built]


def padcall(offset: int, fn: Any) -> Any:
    """``fn()`` called from C with the stack pointer ``offset`` bytes (rounded up to 16) lower
    than a direct call's, through a helper compiled once per machine with ``cc`` into
    ``$XDG_CACHE_HOME/timerl/release``; its result, or its exception re-raised. Raises
    :class:`TimeRLError` when the helper cannot be built."""
    lib = _padcall()
    if lib is None:
        raise TimeRLError("stack offsets: no C compiler to build the padcall helper")
    # an exception must not cross the C frame (ctypes would print and drop it): _handed_back
    return _handed_back(fn, lambda run: lib.timerl_padcall(offset, _PADCALL_CB(run)))


def _padcall() -> Any:
    """The loaded padcall helper, built on first use; None where it cannot be built."""
    if not _padcall_lib:
        _padcall_lib.append(_load_padcall())
    return _padcall_lib[0]


def _handed_back(fn: Any, invoke: Any) -> Any:
    """``invoke(run)`` where ``run()`` calls ``fn()`` and keeps its result or exception; then
    that result returned, or that exception re-raised, in the caller."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append((True, fn()))
        except BaseException as exc:  # handed to the caller
            box.append((False, exc))

    invoke(run)
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _load_padcall() -> Any:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = (
        Path(base) / "timerl" / "release" / f"padcall-{hashlib.sha1(_PADCALL_C.encode()).hexdigest()[:12]}.so"
    )
    try:
        if not path.exists():
            cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
            if cc is None:
                raise OSError("no cc, gcc or clang on PATH")
            path.parent.mkdir(parents=True, exist_ok=True)
            src, tmp = path.with_suffix(f".{os.getpid()}.c"), path.with_suffix(f".{os.getpid()}.tmp")
            src.write_text(_PADCALL_C)
            subprocess.run(
                [cc, "-O1", "-shared", "-fPIC", "-o", str(tmp), str(src)], check=True, capture_output=True
            )
            src.unlink()
            tmp.replace(path)  # atomic: another process may build it at the same time
        lib = ctypes.CDLL(str(path))
        lib.timerl_padcall.argtypes = [ctypes.c_long, _PADCALL_CB]
        lib.timerl_padcall.restype = None
        return lib
    except (OSError, subprocess.CalledProcessError) as exc:
        log.warning("RELEASE measurer: no stack-offset helper (%s); timing at offset 0 only", exc)
        return None


def in_fresh_thread(fn: Any) -> Any:
    """``fn()`` run in a new thread (joined before returning): its result, or its exception
    re-raised here. A new thread starts from the same stack and thread-local state every
    time, unlike a process's main thread (see the module doc)."""

    def invoke(run: Any) -> None:
        t = threading.Thread(target=run, name="release-timing")
        t.start()
        t.join()

    return _handed_back(fn, invoke)


def time_call(
    lib: Any,
    dev: Any,
    args: tuple[Any, ...],
    once: float,
    repeats: int,
    min_repeats: int,
    repeat_ms: float,
    clock: str = "wall",
    estimator: str = "min",
    warmup: bool = True,
) -> float:
    """Seconds per call of ``lib["main"](*args)``: ``repeats`` repeats of about ``repeat_ms``
    each (a kernel slower than that: single calls, as many as fit ``repeats * repeat_ms`` but
    at least ``min_repeats``; ``once``: the seconds of one untimed call), timed by ``clock``
    (``"wall"``: TVM's ``time_evaluator``; ``"cpu"``: the process's CPU time around the calls)
    and reduced by ``estimator`` (``"min"`` or ``"median"`` of the repeats). ``"wall"`` with
    ``"min"`` is :func:`~timerl.envs.looptune.measure.best_seconds`. ``warmup=False``: the
    CPU clock skips its untimed warm-up call (the kernel ran just before)."""
    if clock not in CLOCKS or estimator not in ESTIMATORS:
        raise TimeRLError(f"timing: clock must be one of {CLOCKS} and estimator one of {ESTIMATORS}")
    if clock == "wall" and estimator == "min":
        return best_seconds(lib, dev, args, once, repeats, min_repeats, repeat_ms)
    number, repeat = timing_plan(once, repeats, min_repeats, repeat_ms)
    if clock == "wall":
        results = list(lib.time_evaluator("main", dev, number=number, repeat=repeat)(*args).results)
    else:
        fn = lib["main"]
        if warmup:
            fn(*args)  # warm-up, as time_evaluator does
        results = []
        for _ in range(repeat):
            t = time.process_time_ns()
            for _ in range(number):
                fn(*args)
            results.append((time.process_time_ns() - t) * 1e-9 / number)
    return float(min(results) if estimator == "min" else np.median(results))


def layer_key(layer: Layer) -> str:
    """A layer's identity in a table: its name, kind and sizes."""
    return f"{layer.name}:{layer.kind.value}:{','.join(str(x) for x in layer.sizes)}"


class MeasurementTable:
    """A persistent, append-only table of measurements (JSON lines; see the module doc).

    Every record holds ``settings`` (a string naming the measurer settings it was taken under),
    ``layer`` (:func:`layer_key`), ``config``, ``gflops``, ``valid``, ``seconds`` and ``error``.
    Only records whose ``settings`` equal this table's are answered; the others are kept in the
    file and counted in :attr:`foreign`. :meth:`get` also reads the records other processes
    appended since the last read. :attr:`skipped`: lines that did not parse."""

    def __init__(self, path: str | os.PathLike[str], settings: str) -> None:
        self.path = Path(path)
        self.settings = settings
        self._rows: dict[tuple[str, Config], Measurement] = {}
        self._offset = 0  # bytes of the file read so far (up to its last complete line)
        self.foreign = 0
        self.skipped = 0
        self.appended = 0
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._read()
        if self.foreign:
            log.info(
                "RELEASE table %s: %d record(s) taken under other measurer settings are ignored",
                self.path,
                self.foreign,
            )
        log.info("RELEASE table %s: %d record(s) under these settings", self.path, len(self._rows))

    def __len__(self) -> int:
        return len(self._rows)

    def _read(self) -> None:
        """Reads the lines appended since the last read; a last line without its newline (a
        record being written, or a truncated one) is left for later; a line that does not parse
        is skipped with a warning."""
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                key = (str(r["layer"]), tuple(int(x) for x in r["config"]))
                m = Measurement(
                    key[1], float(r["gflops"]), bool(r["valid"]), float(r["seconds"]), str(r["error"])
                )
            except (ValueError, KeyError, TypeError) as exc:
                self.skipped += 1
                log.warning("RELEASE table %s: skipping a line that does not parse (%s)", self.path, exc)
                continue
            if r.get("settings") != self.settings:
                self.foreign += 1
            else:
                self._rows.setdefault(key, m)
        self._offset += end

    def get(self, layer: Layer, cfg: Config) -> Measurement | None:
        """The recorded measurement of ``cfg`` on ``layer`` under these settings, or None."""
        key = (layer_key(layer), tuple(int(x) for x in cfg))
        if key not in self._rows:
            self._read()  # another process may have measured it meanwhile
        return self._rows.get(key)

    def records(self, layer: Layer) -> list[Measurement]:
        """Every recorded measurement of ``layer`` under these settings (file order)."""
        self._read()
        key = layer_key(layer)
        return [m for (name, _), m in self._rows.items() if name == key]

    def add(self, layer: Layer, m: Measurement) -> None:
        """Appends ``m`` as one line (flushed); a truncated last line of the file is closed
        first, so the record starts on a line of its own."""
        key = (layer_key(layer), tuple(int(x) for x in m.config))
        rec = {
            "settings": self.settings,
            "layer": key[0],
            "config": list(key[1]),
            "gflops": m.gflops,
            "valid": m.valid,
            "seconds": m.seconds,
            "error": m.error,
        }
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self.path.open("a+b") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    line = "\n" + line
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())
        self._rows.setdefault(key, m)
        self.appended += 1


class TemplateMeasurer:
    """Compile-and-time configurations with TVM + LLVM on this CPU (see the module doc).

    **Arguments:** ``repeats`` / ``min_repeats`` / ``repeat_ms``: the timing budget;
    ``clock`` (``"wall"`` or ``"cpu"``) and ``estimator`` (``"min"`` or ``"median"``): the
    timing rule (:func:`time_call`); ``thread`` (``"fresh"`` or ``"caller"``): where a
    configuration is checked and timed, ``stack_offsets``: the stack offsets (bytes) it is
    timed at, the fastest kept; they share the timing budget (each offset gets ``repeats //
    len(stack_offsets)`` repeats and ``ceil(min_repeats / len(stack_offsets))`` at least; see
    the module doc). The defaults: ``clock="cpu"``,
    ``estimator="min"``, ``thread="fresh"``, ``stack_offsets=(0, 16, 32, 48)``;
    ``clock="wall", thread="caller", stack_offsets=(0,)`` is TVM's ``time_evaluator`` rule.
    ``table``: the path of a :class:`MeasurementTable` (None, the default: none),
    which answers every configuration it holds under these settings and records every one
    measured here; :attr:`table_hits` counts the asks it answered (the first ask of each
    configuration in this measurer), :attr:`measured` the configurations measured for real.
    """

    def __init__(
        self,
        repeats: int = 20,
        min_repeats: int = 3,
        repeat_ms: float = 1.0,
        clock: str = "cpu",
        estimator: str = "min",
        thread: str = "fresh",
        stack_offsets: tuple[int, ...] = (0, 16, 32, 48),
        table: str | os.PathLike[str] | None = None,
    ) -> None:
        if min_repeats < 3 or repeats < min_repeats:
            raise TimeRLError(f"need repeats >= min_repeats >= 3, got {repeats}, {min_repeats}")
        if clock not in CLOCKS or estimator not in ESTIMATORS:
            raise TimeRLError(
                f"measurer: clock must be one of {CLOCKS} and estimator one of {ESTIMATORS}, "
                f"got {clock!r}, {estimator!r}"
            )
        if thread not in THREADS:
            raise TimeRLError(f"measurer: thread must be one of {THREADS}, got {thread!r}")
        if not stack_offsets or any(o < 0 or o > 1 << 16 for o in stack_offsets):
            raise TimeRLError(f"measurer: stack offsets must be 1+ values in [0, 65536], got {stack_offsets}")
        self.clock, self.estimator, self.thread = clock, estimator, thread
        self.stack_offsets = tuple(int(o) for o in stack_offsets)
        self.tvm = import_tvm()
        self.target = host_target()
        self.dev = self.tvm.cpu(0)
        self.repeats, self.min_repeats, self.repeat_ms = repeats, min_repeats, repeat_ms
        self._cache: dict[tuple[Layer, Config], Measurement] = {}
        self._inputs: dict[Layer, tuple[Any, Any, np.ndarray]] = {}
        self.measured = 0
        self.failures = 0
        self.asks = 0
        self.table_hits = 0
        self.table = MeasurementTable(table, self.settings()) if table is not None else None

    def settings(self) -> str:
        """The settings a measurement depends on, as the key of a table's records: the timing
        rule, the target, TVM's version and a hash of the template's source."""
        src = Path(template.__file__).read_bytes()
        return json.dumps(
            {
                "clock": self.clock,
                "estimator": self.estimator,
                "thread": self.thread,
                "stack_offsets": list(self.stack_offsets),
                "repeats": self.repeats,
                "min_repeats": self.min_repeats,
                "repeat_ms": self.repeat_ms,
                "target": str(self.target),
                "tvm": str(getattr(self.tvm, "__version__", "?")),
                "template": hashlib.sha1(src).hexdigest()[:12],
            },
            sort_keys=True,
        )

    def _arrays(self, layer: Layer) -> tuple[Any, Any, np.ndarray]:
        if layer not in self._inputs:
            a, b, ref = layer_inputs(layer)
            rt = self.tvm.runtime
            self._inputs[layer] = (rt.tensor(a, self.dev), rt.tensor(b, self.dev), ref)
        return self._inputs[layer]

    def measure(self, space: KnobSpace, cfg: Config) -> Measurement:
        key = (space.layer, tuple(cfg))
        self.asks += 1
        if key in self._cache:
            return self._cache[key]
        if self.table is not None:
            hit = self.table.get(space.layer, cfg)
            if hit is not None:
                self.table_hits += 1
                self._cache[key] = hit
                return hit
        t0 = time.perf_counter()
        try:
            if not space.is_valid(cfg):
                raise TimeRLError("outside the knob space or its register-tile constraint")
            gf = self._time(space, cfg)
            m = Measurement(tuple(cfg), gf, True, time.perf_counter() - t0)
        except Exception as exc:  # a failure of TVM/LLVM or a wrong result: invalid, never fast
            self.failures += 1
            log.warning(
                "RELEASE %s: configuration %s is invalid: %s", space.layer.name, space.describe(cfg), exc
            )
            m = Measurement(tuple(cfg), 0.0, False, time.perf_counter() - t0, str(exc)[:500])
        self.measured += 1
        self._cache[key] = m
        if self.table is not None:
            self.table.add(space.layer, m)
        return m

    def _time(self, space: KnobSpace, cfg: Config) -> float:
        return self.time_lib(space.layer, template.build(space, cfg, self.target))

    def time_lib(self, layer: Layer, fn_mod: Any) -> float:
        """GFLOPS of a built module ``main(A, B, C)`` of ``layer`` (any schedule: the template's
        or another tuner's), checked against NumPy and timed by this measurer's rule; a wrong
        result raises :class:`TimeRLError`."""
        if self.thread == "fresh":
            return in_fresh_thread(lambda: self._check_and_time(layer, fn_mod))
        return self._check_and_time(layer, fn_mod)

    def _check_and_time(self, layer: Layer, fn_mod: Any) -> float:
        fn = fn_mod["main"]
        a, b, ref = self._arrays(layer)
        c = self.tvm.runtime.tensor(np.full(ref.shape, np.nan, np.float32), self.dev)
        t = time.perf_counter()
        fn(a, b, c)
        once = time.perf_counter() - t
        out = c.numpy()
        reduction = math.prod(e for _, e in layer.loops[layer.num_spatial :])
        if not np.allclose(out, ref, rtol=1e-4, atol=1e-5 * reduction):
            bad = float(np.nanmax(np.abs(out - ref))) if np.isfinite(out).any() else float("nan")
            raise TimeRLError(f"wrong result (max abs error {bad:.3g} against NumPy)")
        k = len(self.stack_offsets)  # the timing budget shared by the offsets: no more calls in all

        def timed(first: bool = True) -> float:
            return time_call(
                fn_mod,
                self.dev,
                (a, b, c),
                once,
                max(1, self.repeats // k),
                max(1, -(-self.min_repeats // k)),
                self.repeat_ms,
                self.clock,
                self.estimator,
                warmup=first,
            )

        if self.stack_offsets == (0,) or _padcall() is None:  # a direct call (no helper: logged once)
            best = timed()
        else:
            best = min(padcall(o, lambda o=o: timed(o == self.stack_offsets[0])) for o in self.stack_offsets)
        return layer.flops / best / 1e9

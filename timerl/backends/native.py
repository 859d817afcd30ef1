"""A native ``tanh`` for the Torch backend on CPUs where neither PyTorch's nor NumPy's is fast.

PPO's actor and critic spend much of their time in ``tanh`` (the acting loop evaluates it
over (512, 64) blocks 500 times an iteration, the learner over (128000, 64) twice). On an
AVX2-only CPU (AMD EPYC, one thread, torch 2.13, NumPy 2.4) ``torch.tanh`` (Sleef, 1 ulp)
took 27 ms per (128000, 64) and NumPy's float32 ufunc (vectorized on AVX-512 only) 22 ms,
against XLA's 4.9 ms.

The kernel here is a rational function, ``x P(x^2) / Q(x^2)`` (P of degree 5, Q of degree 3
in ``x^2``) on ``x`` clamped to [-9, 9] (beyond, ``tanh`` rounds to +-1 in float32), the
result clamped to [-1, 1]: ten multiply-adds and one division per element, no table, no
branch, which the C compiler vectorizes. Its coefficients were fitted for it (least squares
on the relative error over [0, 9], reweighted towards the largest errors): 0.5 ulp in exact
arithmetic, 3.1 ulp evaluated in float32 (``torch.tanh`` is within 1 ulp, glibc's vector
``tanhf`` 0.6). Same CPU: 4.3 ms per (128000, 64) (glibc's vector ``tanhf``, the kernel
before: 8.1 ms), 25 us per (512, 64) (34-51 us). XLA's own CPU ``tanh`` is a rational
approximation too.

On first use this module compiles the kernel with the system's C compiler (``$CC``, else
``cc`` or ``gcc``) for this CPU (``-march=native``), into the user's cache
(``$XDG_CACHE_HOME/timerl/kernels``, keyed by the source, flags, compiler and CPU), checks
it against ``np.tanh`` in float64 over [-20, 20] and at 0, +-inf and nan, times it against
NumPy's ufunc on (512, 64) and keeps the faster (on AVX-512 NumPy's own is fast). Where there
is no compiler, the build fails or the check fails, NumPy's ufunc is used and the reason is
logged once at INFO. ``TIMERL_NATIVE_KERNELS=0`` turns the build off.

Why not a library: PyTorch's and NumPy's are the two at hand and are the slow ones here;
``torch.compile`` generates the same Sleef call; XLA's kernel would make the Torch backend run
JAX. The kernel is compiled without ``-ffast-math`` (``nan`` stays ``nan``, and the process's
floating-point flags are not changed by loading it); ``-fno-trapping-math`` lets the compiler
turn the clamps into vector selects.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

ENV_VAR = "TIMERL_NATIVE_KERNELS"

SOURCE = r"""
#include <stddef.h>

void timerl_tanh_f32(const float *restrict x, float *restrict y, size_t n) {
#pragma omp simd
  for (size_t i = 0; i < n; i++) {
    float v = x[i];
    v = v > 9.0f ? 9.0f : (v < -9.0f ? -9.0f : v); /* nan compares false: stays nan */
    float s = v * v;
    float p = 1.826274722e-11f;
    p = p * s + -1.278343387e-08f;
    p = p * s + 9.268429494e-06f;
    p = p * s + 2.920872532e-03f;
    p = p * s + 1.291933209e-01f;
    p = p * s + 9.999999404e-01f;
    float q = 2.281155030e-04f;
    q = q * s + 2.376362123e-02f;
    q = q * s + 4.625261426e-01f;
    q = q * s + 1.0f;
    float r = v * p / q;
    y[i] = r > 1.0f ? 1.0f : (r < -1.0f ? -1.0f : r);
  }
}
"""
CFLAGS = ("-O3", "-march=native", "-fno-trapping-math", "-fno-math-errno", "-fopenmp-simd", "-fPIC")
MAX_ULP = 4.0
"""The largest error accepted, in units of float32's epsilon relative to the float64 result."""

Kernel = Callable[[int, int, int], None]
"""``kernel(x, out, n)``: ``out[:n] = tanh(x[:n])`` for the addresses of C-contiguous float32
buffers (``Tensor.data_ptr()``, ``ndarray.ctypes.data``; a ctypes function: ~1 us a call)."""


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "timerl" / "kernels"


def _cpu_id() -> str:
    """The CPU's model and feature flags (a library built with ``-march=native`` is for them)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    lines = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name.split()[0]):
            return name
    return None


def _build(cc: str) -> Path:
    """The shared library, compiled into the cache unless it is there already."""
    version = subprocess.run([*cc.split(), "--version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256("\0".join([SOURCE, *CFLAGS, cc, version, _cpu_id()]).encode()).hexdigest()[:16]
    lib = _cache_dir() / f"tanh-{key}.so"
    if lib.exists():
        return lib
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        src, obj, out = Path(tmp, "k.c"), Path(tmp, "k.o"), Path(tmp, "k.so")
        src.write_text(SOURCE)
        for cmd in (
            [*cc.split(), *CFLAGS, "-c", str(src), "-o", str(obj)],
            [*cc.split(), "-shared", str(obj), "-o", str(out)],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise OSError(f"`{' '.join(cmd)}` failed: {done.stderr.strip()[-400:]}")
        os.replace(out, lib)  # atomic: parallel processes may build it at once
    return lib


def _load(lib: Path) -> Kernel:
    fn = ctypes.CDLL(str(lib)).timerl_tanh_f32
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    fn.restype = None
    return fn


def _check(kernel: Kernel) -> None:
    """Raise ``ValueError`` unless ``kernel`` agrees with the float64 ``tanh``."""
    x = np.concatenate(
        [
            np.linspace(-20, 20, 200_001, dtype=np.float32),
            np.float32([0, -0.0, 1e-30, np.inf, -np.inf, np.nan]),
        ]
    )
    y = np.empty_like(x)
    kernel(x.ctypes.data, y.ctypes.data, x.size)
    want = np.tanh(x.astype(np.float64))
    finite = np.isfinite(want)
    err = np.abs(y[finite] - want[finite]) / np.maximum(np.abs(want[finite]), np.finfo(np.float32).tiny)
    ulp = float(err.max() / np.finfo(np.float32).eps)
    if ulp > MAX_ULP or not np.isnan(y[-1]) or y[-3] != 1 or y[-2] != -1:
        raise ValueError(f"its results differ from float64 tanh by up to {ulp:.1f} ulp (or at inf/nan)")


def _best_of(fn: Callable[[], None], reps: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


@functools.cache
def tanh_f32() -> Kernel | None:
    """The native float32 ``tanh`` where it is built, correct and faster than NumPy's ufunc
    on this CPU; None otherwise (the reason logged at INFO)."""
    if os.environ.get(ENV_VAR, "1") == "0":
        log.info("native tanh off (%s=0): NumPy's ufunc is used", ENV_VAR)
        return None
    cc = _compiler()
    if cc is None:
        log.info("native tanh not built: no C compiler found ($CC, cc, gcc, clang); NumPy's ufunc is used")
        return None
    try:
        kernel = _load(_build(cc))
        _check(kernel)
    except (OSError, subprocess.SubprocessError, ValueError, AttributeError) as exc:
        log.info("native tanh not used (%s); NumPy's ufunc is used", exc)
        return None
    x = np.random.default_rng(0).standard_normal((512, 64)).astype(np.float32)
    y = np.empty_like(x)
    native = _best_of(lambda: kernel(x.ctypes.data, y.ctypes.data, x.size))
    ufunc = _best_of(lambda: np.tanh(x, out=y))
    if native >= ufunc:
        log.info(
            "native tanh not used: NumPy's ufunc is as fast on this CPU (%.0f vs %.0f us)",
            ufunc * 1e6,
            native * 1e6,
        )
        return None
    log.info(
        "tanh: a native kernel (a rational approximation), %.0f vs NumPy's %.0f us per (512, 64)",
        native * 1e6,
        ufunc * 1e6,
    )
    return kernel

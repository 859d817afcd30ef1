"""glibc ``malloc`` settings for timerl's processes: one arena, freed memory kept.

Both are process-wide (``mallopt``) and set once, when ``timerl`` is imported, so that they
precede the threads XLA starts (a JAX environment's import starts them, before any backend
is chosen). Other C libraries (musl, macOS) are left alone; ``LD_PRELOAD``-ed allocators
(jemalloc, tcmalloc) do not read them.

**One arena** (:func:`limit_malloc_arenas`, ``M_ARENA_MAX``): XLA's CPU client allocates
buffers on its worker threads, and glibc gives each allocating thread its own arena; a freed
buffer goes back to the arena that allocated it and an arena returns memory only from the
top of its heap, so the process kept the high-water mark of every arena (openxla/xla#2265
describes the same retention). PPO at 512 envs x 250 steps on JAX held 1,085 MB peak RSS
with glibc's eight arenas per core, 841 MB with one (``docs/memory.md``, "The allocator").
``TIMERL_MALLOC_ARENAS`` sets another count, ``0`` keeps glibc's default.

**Freed memory kept** (:func:`keep_freed_host_memory`): glibc serves a block above
``M_MMAP_THRESHOLD`` (at most 32 MiB) with its own ``mmap`` and unmaps it on free, and it
trims its heap above ``M_TRIM_THRESHOLD``: every such buffer then comes back as fresh pages,
one page fault per 4 KiB and the kernel zeroing it. Arrays of tens of MB are made and freed
many times per iteration (PPO at 512 x 250: (512, 250, 64) float32 activations, 31 MiB each;
XLA's temporary buffer per call, 228 MB for PPO's whole iteration compiled as one call). So
no block is ``mmap``-ed (``M_MMAP_MAX = 0``: all come from the heap and are reused there), the
heap is trimmed only above 1 GiB and grows 64 MiB at a time, the way PyTorch's CUDA caching
allocator keeps device memory: resident memory stays near the peak instead of shrinking
between iterations. Measured (AVX2 VM, one core, PPO gymnax 512 x 250, JAX, median s/iter
and minor page faults per iteration, two rounds alternated with glibc's defaults): statement
by statement 0.295 / 0.260 s and 16,500 faults -> 0.238 / 0.221 s and none; the iteration
compiled as one call 0.382 / 0.361 s and 58,300 faults -> 0.208 / 0.238 s and none; peak RSS
902-932 -> 883-949 MB and 1,130-1,158 -> 1,022-1,039 MB. ``TIMERL_KEEP_HOST_MEMORY=0`` keeps
glibc's defaults. A block larger than a thread arena's heap (64 MiB) is still ``mmap``-ed by a thread
that allocated before the arena limit was set.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Callable

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_MAX = -4
M_ARENA_MAX = -8
"""``mallopt``'s parameter numbers (glibc ``malloc.h``)."""

ENV_VAR = "TIMERL_MALLOC_ARENAS"
KEEP_ENV_VAR = "TIMERL_KEEP_HOST_MEMORY"
DEFAULT_ARENAS = 1
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 << 20

_done = False
_kept = False


def _mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``, or None off glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6").mallopt  # glibc's soname (find_library would run ldconfig)
    except (OSError, AttributeError) as exc:  # no libc found, or no mallopt in it
        log.debug("mallopt unavailable (%s); malloc left as it is", exc)
        return None


def configure_malloc() -> None:
    """Both settings of the module doc, once per process (``import timerl`` calls it)."""
    limit_malloc_arenas()
    keep_freed_host_memory()


def limit_malloc_arenas() -> int | None:
    """Limit glibc's malloc arenas to ``TIMERL_MALLOC_ARENAS`` (default 1), once per process.

    Returns the limit set, or None where nothing was changed (not glibc, the variable is 0,
    or it was already called)."""
    global _done
    if _done:
        return None
    _done = True
    raw = os.environ.get(ENV_VAR, str(DEFAULT_ARENAS)).strip()
    try:
        n = int(raw)
    except ValueError:
        log.warning("%s=%r is not an integer; glibc's malloc arenas are left as they are", ENV_VAR, raw)
        return None
    mallopt = _mallopt() if n > 0 else None
    if mallopt is None:
        return None
    if not mallopt(M_ARENA_MAX, n):
        log.debug("mallopt(M_ARENA_MAX, %d) was refused", n)
        return None
    log.debug("glibc malloc arenas limited to %d (%s)", n, ENV_VAR)
    return n


def keep_freed_host_memory() -> bool:
    """Set glibc's malloc to keep freed blocks (module doc), once per process; whether the
    settings apply (False off glibc or with ``TIMERL_KEEP_HOST_MEMORY=0``)."""
    global _kept
    if _kept:
        return True
    if os.environ.get(KEEP_ENV_VAR, "1") == "0":
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    _kept = bool(
        mallopt(M_MMAP_MAX, 0) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) and mallopt(M_TOP_PAD, TOP_PAD)
    )
    log.debug("malloc keeps freed host memory: %s", _kept)
    return _kept

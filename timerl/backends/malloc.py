"""glibc ``malloc`` settings for XLA's CPU buffers (issue 11: PPO's peak RSS on JAX).

XLA's CPU client allocates the output buffers of a computation on its worker threads, and
glibc gives each allocating thread its own arena. Freed buffers go back to the arena that
allocated them, and an arena returns memory to the system only from the top of its heap,
so the process keeps the high-water mark of every arena (openxla/xla#2265 describes the
same retention after compiling). PPO at 512 envs x 250 steps on CartPole (one minibatch,
JAX, 10 iterations) held 1,085 MB peak RSS while the heap in use peaked near 0.45 GB;
with one arena it held 841 MB (``docs/memory.md``, "The allocator").

:func:`limit_malloc_arenas` calls ``mallopt(M_ARENA_MAX, n)`` once, before the JAX
backend starts XLA's threads. It is process-wide, like ``jax_enable_x64``; set
``TIMERL_MALLOC_ARENAS`` to another count, or to ``0`` to keep glibc's default (eight
arenas per core). Other C libraries (musl, macOS) are left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

M_ARENA_MAX = -8
"""``mallopt``'s parameter number for the arena limit (glibc ``malloc.h``)."""

ENV_VAR = "TIMERL_MALLOC_ARENAS"
DEFAULT_ARENAS = 1

_done = False


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
    if n <= 0 or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")  # glibc's soname (find_library would run ldconfig)
        ok = libc.mallopt(M_ARENA_MAX, n)
    except (OSError, AttributeError) as exc:  # no libc found, or no mallopt in it
        log.debug("mallopt unavailable (%s); malloc arenas left as they are", exc)
        return None
    if not ok:
        log.debug("mallopt(M_ARENA_MAX, %d) was refused", n)
        return None
    log.debug("glibc malloc arenas limited to %d (%s)", n, ENV_VAR)
    return n

"""``timerl.backends.malloc``: glibc malloc settings ``import timerl`` makes (one arena, freed
memory kept), each once per process and each with a variable that turns it off."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from timerl.backends import malloc

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def _fresh(monkeypatch: pytest.MonkeyPatch, value: str | None) -> int | None:
    monkeypatch.setattr(malloc, "_done", False)
    if value is None:
        monkeypatch.delenv(malloc.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(malloc.ENV_VAR, value)
    return malloc.limit_malloc_arenas()


@pytest.mark.skipif(not GLIBC, reason="the arena limit is glibc's")
def test_default_limit_is_one_arena_and_set_once(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _fresh(monkeypatch, None) == malloc.DEFAULT_ARENAS == 1
    assert malloc.limit_malloc_arenas() is None  # once per process


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_zero_or_bad_values_leave_glibc_alone(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    assert _fresh(monkeypatch, value) is None


@pytest.mark.skipif(not GLIBC, reason="the arena limit is glibc's")
def test_jax_backend_sets_it_on_import() -> None:
    code = (
        "import timerl.backends.malloc as m, timerl.backends.jax_backend;"
        "print(m._done, m.limit_malloc_arenas())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "None"]


_PROBE = "import timerl.backends.malloc as m\nprint(m.keep_freed_host_memory(), m.keep_freed_host_memory())\n"


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_keeping_freed_memory_applies_once_per_process_and_can_be_turned_off() -> None:
    def run(env: dict[str, str]) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True
        )
        return done.stdout.split()

    base = {k: v for k, v in os.environ.items() if k != malloc.KEEP_ENV_VAR}
    assert run(base) == ["True", "True"]
    assert run({**base, malloc.KEEP_ENV_VAR: "0"}) == ["False", "False"]


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_importing_timerl_sets_both_before_jax_is_imported() -> None:
    code = "import sys, timerl, timerl.backends.malloc as m; print(m._done, m._kept, 'jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "False"]


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_a_large_buffer_freed_and_made_again_does_not_fault_its_pages_back_in() -> None:
    """The reason for the settings: a 64 MiB block freed and allocated again is reused from
    the heap (no page faults), where glibc's defaults unmap and map it again (~16,000 faults)."""
    code = (
        "import ctypes, resource, sys\n"
        "if sys.argv[1] == '1':\n"
        "    import timerl\n"
        "libc = ctypes.CDLL('libc.so.6')\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "libc.free.argtypes = [ctypes.c_void_p]\n"
        "def touch():\n"  # 64 MiB from malloc, written, freed (NumPy would ask for huge pages)
        "    p = libc.malloc(64 << 20)\n"
        "    ctypes.memset(p, 1, 64 << 20)\n"
        "    libc.free(p)\n"
        "for _ in range(3):\n"
        "    touch()\n"
        "f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(5):\n"
        "    touch()\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) // 5)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in (malloc.KEEP_ENV_VAR, malloc.ENV_VAR)}

    def faults(with_timerl: str) -> int:
        done = subprocess.run(
            [sys.executable, "-c", code, with_timerl], capture_output=True, text=True, env=env, check=True
        )
        return int(done.stdout.split()[-1])

    assert faults("0") > 10_000  # glibc's defaults: the pages come back fresh every time
    assert faults("1") < 100

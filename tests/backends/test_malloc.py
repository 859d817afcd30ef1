"""``timerl.backends.malloc``: the glibc arena limit the JAX backend sets on import."""

from __future__ import annotations

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

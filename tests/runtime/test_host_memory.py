"""glibc malloc settings that keep freed host memory (runtime/host_memory.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_PROBE = (
    "from timerl.runtime.host_memory import keep_freed_host_memory\n"
    "print(keep_freed_host_memory(), keep_freed_host_memory())\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_applies_once_per_process_and_can_be_turned_off() -> None:
    run = lambda env: subprocess.run(  # noqa: E731
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True
    ).stdout.split()
    base = {k: v for k, v in os.environ.items() if k != "TIMERL_KEEP_HOST_MEMORY"}
    assert run(base) == ["True", "True"]
    assert run({**base, "TIMERL_KEEP_HOST_MEMORY": "0"}) == ["False", "False"]

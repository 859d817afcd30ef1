"""Shared fixtures of the runtime tests; makes ``runtime_pdgs`` importable whatever the import mode."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from timerl.backends import AbstractBackend, get_backend  # noqa: E402


@pytest.fixture(params=["jax", "torch"])
def backend(request: pytest.FixtureRequest) -> AbstractBackend:
    """Every runtime test runs on both real backends."""
    return get_backend(request.param)

"""Shared fixtures of the RELEASE tests: tiny layers, so that TVM builds take ~0.1 s."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TVM_NUM_THREADS", "1")

pytest.importorskip("lightgbm")
pytest.importorskip("sklearn")

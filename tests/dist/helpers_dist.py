"""Helpers shared by the distributed tests."""

from __future__ import annotations

import numpy as np


def assert_same(got: dict, want: dict) -> None:
    """The same keys, and bit-for-bit equal arrays under each (a rollout's sinks)."""
    assert got.keys() == want.keys()
    for key, w in want.items():
        np.testing.assert_array_equal(got[key], w, err_msg=str(key))

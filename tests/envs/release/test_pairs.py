"""benchmarks/release_pairs.py's bootstrap interval of the paired ratio of medians."""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"))
import release_pairs  # noqa: E402


def test_bootstrap_ratio_brackets_the_ratio_and_narrows_with_seeds() -> None:
    """Pairs whose ratio is exactly 2 give the interval (2, 2); noisy pairs around a ratio of 2
    give an interval containing their ratio of medians, narrower for 60 seeds than for 6."""
    assert release_pairs.bootstrap_ratio([20, 40, 60], [10, 20, 30], 200) == (2.0, 2.0)
    rng = np.random.default_rng(0)
    widths = []
    for n in (6, 60):
        other = rng.integers(10, 60, n)
        own = np.round(2 * other * rng.uniform(0.5, 1.5, n))
        lo, hi = release_pairs.bootstrap_ratio(list(own), list(other), 2000)
        assert lo < np.median(own) / np.median(other) < hi
        widths.append(hi - lo)
    assert widths[1] < widths[0]


def test_bootstrap_geomean() -> None:
    """The geometric mean of per-seed ratios (2 and 8: 4) lies inside its interval; constant
    ratios give a point interval."""
    g, lo, hi = release_pairs.bootstrap_geomean([2.0, 8.0], 500)
    assert np.isclose(g, 4.0) and 2.0 <= lo < 4.0 < hi <= 8.0
    assert np.allclose(release_pairs.bootstrap_geomean([3.0] * 5, 100), 3.0)

"""Dependence-distance intervals used by clustering and proximity selection."""

from __future__ import annotations

import math

import pytest

from timerl.schedule.distance import FULL, component_offset, lex_nonpositive
from timerl.symbolic import Slice, Sym, smin

t, T = Sym("t"), Sym("T", is_bound=True)
INF = math.inf


@pytest.mark.parametrize(
    ("comp", "expected"),
    [
        (t, (0, 0)),
        (t - 1, (-1, -1)),
        (t + 3, (3, 3)),
        (Slice(t, T), (0, INF)),
        (Slice(t * 0, T), (-INF, INF)),
        (Slice(t * 0, t + 1), (-INF, 0)),
        (Slice(t, smin(t + 5, T)), (0, 4)),
        (t * 0, (-INF, 0)),
        (T - 1, (0, INF)),
        (t * 2, FULL),
        (t - t % 4, (-3, 0)),  # a target network refreshed every 4 iterations: w[i - i % 4]
        (t - t % 4 - 1, (-4, -1)),
        (t % 3, (-INF, 2)),
    ],
)
def test_component_offsets(comp, expected) -> None:
    assert component_offset(comp, t, T) == expected


def test_offsets_cover_every_read_point() -> None:
    """Brute force: every point a component reads lies inside its interval."""
    comps = [t - 1, Slice(t, T), Slice(t * 0, t + 1), Slice(t, smin(t + 3, T)), T - 1, t * 0, t - t % 4]
    for comp in comps:
        lo, hi = component_offset(comp, t, T)
        for tv in range(1, 8):
            for q in range(tv):
                env = {t: q, T: tv}
                if isinstance(comp, Slice):
                    pts = range(_ev(comp.start, env), _ev(comp.stop, env))
                else:
                    pts = [_ev(comp, env)]
                for p in pts:
                    assert lo <= p - q <= hi, (comp, tv, q, p)


def _ev(e, env):
    from timerl.symbolic import evaluate

    return evaluate(e, env)


def test_lex_nonpositive() -> None:
    assert lex_nonpositive(((-1, -1), (0, INF)), (1, 1), strict=True)  # earlier i, any t
    assert not lex_nonpositive(((0, 0), (0, INF)), (1, 1), strict=True)  # same i, later t
    assert lex_nonpositive(((0, 0), (0, INF)), (1, -1), strict=False)  # t runs downwards
    assert lex_nonpositive(((0, 0), (0, 0)), (1, 1), strict=False)
    assert not lex_nonpositive(((0, 0), (0, 0)), (1, 1), strict=True)
    assert not lex_nonpositive(((-INF, INF),), (1,), strict=False)

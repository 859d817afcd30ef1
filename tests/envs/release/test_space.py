"""Knob spaces: the tile knobs, moves, features and the errors of a space with no valid point."""

from __future__ import annotations

import numpy as np
import pytest

from timerl.envs.release.space import ITERVAR_PER_LOOP, Knob, KnobSpace, Layer, template_space
from timerl.errors import TimeRLError


def test_template_space_knobs_and_constraint() -> None:
    """A conv2d space has a tile knob per loop (divisors up to 64) and the unroll/CPU knobs;
    random configurations keep the register tile within its cap."""
    sp = template_space(Layer.conv2d("t", 8, 16, 6, 3, 1, 1), max_tile_elems=32)
    assert sp.names == (
        "tile_f", "tile_y", "tile_x", "tile_rc", "tile_ry", "tile_rx",
        "auto_unroll_max_step", "unroll_explicit", "vectorize", "parallel",
    )  # fmt: skip
    assert sp.knobs[0].values == (1, 2, 4, 8, 16)
    assert sp.knobs[4].values == (1, 3)
    rng = np.random.default_rng(0)
    for _ in range(200):
        c = sp.random(rng)
        assert sp.is_valid(c) and sp.tile_elems(c) <= 32
    assert sp.features([sp.random(rng)]).shape == (1, 13)


def test_move_clips_and_keeps_invalid_moves_out() -> None:
    """Directions move each index by one, clipped; a move past the tile cap is refused."""
    sp = template_space(Layer.matmul("mm", 16, 16, 16), max_tile_elems=64)
    c = (0, 0, 0, 0, 0, 0, 0)
    assert sp.move(c, (-1, 1, 0, 1, 0, 0, 1)) == (0, 1, 0, 1, 0, 0, 1)
    big = (3, 3, 0, 0, 0, 0, 0)  # 8 x 8 = 64 elements: at the cap
    assert sp.is_valid(big)
    assert sp.move(big, (1, 0, 0, 0, 0, 0, 0)) == big  # 16 x 8 > 64: unchanged


def test_space_without_valid_point_is_an_error() -> None:
    """A knob with no value, or a cap below every register tile, raises a clear TimeRLError."""
    mm = Layer.matmul("mm", 16, 16, 16)
    with pytest.raises(TimeRLError, match="knob tile_i has no value"):
        KnobSpace(mm, (Knob("tile_i", ()), Knob("tile_j", (1,)), Knob("tile_k", (1,))))
    with pytest.raises(TimeRLError, match="no configuration has a register tile of at most 3"):
        KnobSpace(mm, (Knob("tile_i", (2, 4)), Knob("tile_j", (2,)), Knob("tile_k", (1,))), max_tile_elems=3)


def test_reference_conv_matches_direct_loops() -> None:
    """The NumPy conv2d reference (strided windows) against a direct loop nest."""
    lay = Layer.conv2d("t", 3, 4, 7, 3, 2, 1)
    rng = np.random.default_rng(0)
    (sa, sb, sc) = lay.input_shapes()
    a, b = rng.standard_normal(sa), rng.standard_normal(sb)
    want = np.zeros(sc)
    for f in range(sc[0]):
        for y in range(sc[1]):
            for x in range(sc[2]):
                want[f, y, x] = (a[:, 2 * y : 2 * y + 3, 2 * x : 2 * x + 3] * b[f]).sum()
    np.testing.assert_allclose(lay.reference(a, b), want, rtol=1e-12)


@pytest.mark.parametrize(
    "lay", [Layer.conv2d("c", 8, 16, 14, 3, 2, 1), Layer.matmul("m", 32, 48, 16)], ids=lambda x: x.name
)
def test_itervar_features_are_deterministic_with_the_documented_length(lay: Layer) -> None:
    """``features(kind="itervar")``: the knob features, then ITERVAR_PER_LOOP per loop of the
    nest (two per layer loop); the same configurations give the same features; finite; and
    the outermost loop's iterations are the layer's whole iteration space."""
    sp = template_space(lay)
    rng = np.random.default_rng(0)
    cfgs = [sp.random(rng) for _ in range(20)]
    knob = sp.features(cfgs)
    f = sp.features(cfgs, "itervar")
    assert f.shape == (20, len(sp.knobs) + 3 + ITERVAR_PER_LOOP * 2 * len(lay.loops))
    assert np.array_equal(f[:, : knob.shape[1]], knob)
    assert np.array_equal(f, sp.features(list(cfgs), "itervar")) and np.isfinite(f).all()
    iters = np.prod([e for _, e in lay.loops])
    loop = sp.loop_features(cfgs)
    assert np.allclose(loop[:, 1], np.log2(iters + 1.0))  # loop 0's second feature: all iterations
    with pytest.raises(TimeRLError, match="kind"):
        sp.features(cfgs, "ast")

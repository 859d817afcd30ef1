"""The native float32 ``tanh`` of the Torch backend (``backends/native.py``): built with the
system's C compiler into the cache, checked against float64 ``tanh``, and NumPy's ufunc
wherever it cannot be built or is not faster (the reason logged)."""

from __future__ import annotations

import ctypes
import logging
import shutil

import numpy as np
import pytest
import torch

from timerl.backends import native
from timerl.backends.torch_backend import _tanh


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native.tanh_f32.cache_clear()
    yield
    native.tanh_f32.cache_clear()


def _ulp(got: np.ndarray, x: np.ndarray) -> float:
    want = np.tanh(x.astype(np.float64))
    err = np.abs(got.astype(np.float64) - want) / np.maximum(np.abs(want), np.finfo(np.float32).tiny)
    return float(err.max() / np.finfo(np.float32).eps)


@pytest.mark.skipif(native._compiler() is None, reason="no C compiler on this machine")
def test_the_kernel_is_built_into_the_cache_and_agrees_with_float64_tanh(tmp_path) -> None:
    lib = native._build(native._compiler())
    assert lib.parent == tmp_path / "timerl" / "kernels" and lib.exists()
    assert native._build(native._compiler()) == lib  # built once, then found
    kernel = native._load(lib)
    native._check(kernel)
    x = (np.random.default_rng(1).standard_normal(100_003) * 4).astype(np.float32)
    y = np.empty_like(x)
    kernel(x.ctypes.data, y.ctypes.data, x.size)
    assert _ulp(y, x) <= native.MAX_ULP


def test_a_kernel_that_computes_something_else_is_refused() -> None:
    def wrong(x: int, out: int, n: int) -> None:
        xs = np.ctypeslib.as_array(ctypes.cast(x, ctypes.POINTER(ctypes.c_float)), (n,))
        ys = np.ctypeslib.as_array(ctypes.cast(out, ctypes.POINTER(ctypes.c_float)), (n,))
        np.tanh(xs * np.float32(1.0001), out=ys)

    with pytest.raises(ValueError, match="ulp"):
        native._check(wrong)


def test_torch_backend_tanh_matches_float64_on_views_and_dtypes() -> None:
    """Whichever kernel this machine picked: contiguous, strided, negated views and float64."""
    base = torch.randn(300, 70) * 3
    for x in (base, base[:, ::3], base.t(), -base[1:], base.double(), base[:0], base[:5]):
        got = _tanh(x)
        assert got.shape == x.shape and got.dtype == x.dtype
        want = torch.tanh(x.double()).to(x.dtype)
        torch.testing.assert_close(got, want, rtol=4 * torch.finfo(x.dtype).eps, atol=1e-30)


def test_without_a_compiler_or_when_turned_off_numpy_is_used_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="timerl.backends.native")
    monkeypatch.setattr(native, "_compiler", lambda: None)
    assert native.tanh_f32() is None
    assert "no C compiler found" in caplog.text
    native.tanh_f32.cache_clear()
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert native.tanh_f32() is None
    assert f"{native.ENV_VAR}=0" in caplog.text
    assert torch.equal(_tanh(torch.zeros(3)), torch.zeros(3))


def test_a_compiler_that_fails_is_reported(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if shutil.which("false") is None:
        pytest.skip("no `false` command")
    caplog.set_level(logging.INFO, logger="timerl.backends.native")
    monkeypatch.setattr(native, "_compiler", lambda: "false")
    assert native.tanh_f32() is None
    assert "native tanh not used" in caplog.text and "failed" in caplog.text

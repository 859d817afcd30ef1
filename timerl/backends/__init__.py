"""Tensor backends: the only package that imports jax or torch.

``get_backend("jax")`` / ``get_backend("torch")`` build a fresh backend; the library is
imported on first use, so a program on one backend never imports the other.
"""

from __future__ import annotations

from timerl.backends.base import AbstractBackend as AbstractBackend
from timerl.errors import BackendError

BACKEND_NAMES = ("jax", "torch")


def get_backend(name: str) -> AbstractBackend:
    """A new backend by name (``"jax"`` or ``"torch"``)."""
    if name == "jax":
        from timerl.backends.jax_backend import JaxBackend

        return JaxBackend()
    if name == "torch":
        from timerl.backends.torch_backend import TorchBackend

        return TorchBackend()
    raise BackendError(f"unknown backend {name!r}; valid names: {', '.join(BACKEND_NAMES)}")


def import_backend(name: str) -> float:
    """Import backend ``name``'s module (and so its framework: jax or torch) now; the seconds it
    took (about 0 when it was imported already). A program's "compiled in" time then leaves out
    the framework's first import (torch: ~2.7 s on the 2-core CPU)."""
    import importlib
    import sys
    import time

    if name not in BACKEND_NAMES:
        raise BackendError(f"unknown backend {name!r}; valid names: {', '.join(BACKEND_NAMES)}")
    module = f"timerl.backends.{name}_backend"
    if module in sys.modules:
        return 0.0
    t0 = time.perf_counter()
    importlib.import_module(module)
    return time.perf_counter() - t0

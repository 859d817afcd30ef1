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

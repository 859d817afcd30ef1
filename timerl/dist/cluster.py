"""Importing Ray lazily and connecting to a cluster (checked before anything compiles)."""

from __future__ import annotations

import logging
import socket
from typing import Any

from timerl.errors import DistributedError

log = logging.getLogger("timerl.dist")

INSTALL_HINT = 'pip install -e ".[dist]"'


def import_ray() -> Any:
    """The ``ray`` module, or a :class:`DistributedError` saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise DistributedError(
            f"Ray runners need the 'ray' package, which is not installed: {INSTALL_HINT} "
            "(or pip install 'ray==2.60.0')"
        ) from exc
    return ray


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[-1]
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise DistributedError(
            f"Ray cluster address {address!r} is not of the form 'host:port' (e.g. '10.0.0.1:6379', "
            "what `ray start --head` prints), 'ray://host:port', 'auto' or None (a local Ray)"
        )
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Raise :class:`DistributedError` naming ``address`` when no TCP connection to it opens."""
    host, port = _host_port(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise DistributedError(
            f"cannot reach the Ray cluster at {address!r}: {exc}. Start it with `ray start --head "
            f"--port={port}` on {host} (workers: `ray start --address={host}:{port}`), or pass "
            "address=None for a Ray instance on this machine"
        ) from exc


def connect(address: str | None = None, timeout_s: float = 5.0) -> Any:
    """Connect this process to the Ray cluster at ``address`` (``None``: start or reuse a
    local Ray) and return the ``ray`` module. An address that cannot be reached raises
    :class:`DistributedError` naming it, even when Ray is already initialised."""
    ray = import_ray()
    if address not in (None, "auto", "local"):
        check_reachable(address, timeout_s)
    if ray.is_initialized():
        log.debug("Ray already initialised in this process; reusing it (address %r)", address)
        return ray
    try:
        ray.init(address=address, include_dashboard=False, ignore_reinit_error=True)
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError or ValueError here
        raise DistributedError(f"cannot connect to the Ray cluster at {address!r}: {exc}") from exc
    return ray

"""Errors of the distributed layer."""

from __future__ import annotations

from timerl.errors import TimeRLError


class DistributedError(TimeRLError):
    """Ray is missing, a cluster cannot be reached, or remote runners keep failing."""

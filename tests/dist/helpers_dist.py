"""Helpers shared by the distributed tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np


@contextlib.contextmanager
def two_node_cluster() -> Iterator[Any]:
    """A local Ray cluster of a head node and one worker node (separate processes, one CPU
    each), this process connected to it; shut down on exit."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def assert_same(got: dict, want: dict) -> None:
    """The same keys, and bit-for-bit equal arrays under each (a rollout's sinks)."""
    assert got.keys() == want.keys()
    for key, w in want.items():
        np.testing.assert_array_equal(got[key], w, err_msg=str(key))

"""``benchmarks/peers.py`` on its in-repo peers (timerl-jax, the single-jit JAX PPO, the eager
torch PPO) at a tiny size: each runs pinned in its own process and comes back with finite
numbers; the table has a row per peer, a failed peer's row says why. No timing assertions,
and no SB3 / RLlib virtualenv is made here."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

PEERS_PY = Path(__file__).resolve().parents[2] / "benchmarks" / "peers.py"


@pytest.fixture(scope="module")
def peers():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("peers", PEERS_PY)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["peers"] = mod  # dataclasses look the module up
    spec.loader.exec_module(mod)
    return mod


def test_in_repo_peers_tiny(peers) -> None:  # noqa: ANN001
    cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    cfg = peers.Config(num_envs=4, num_steps=8, iterations=1, warmup=0, cores=cores, timeout=120)
    names = ["timerl-jax", "jax-jit", "torch-eager"]
    # the three at once (a test, not a measurement: the benchmark itself runs them in turn)
    with ThreadPoolExecutor(len(names)) as pool:
        res = dict(zip(names, pool.map(lambda p: peers.run_peer(cfg, p, sys.executable), names), strict=True))
    for name, r in res.items():
        assert "error" not in r, (name, r.get("error"), r.get("stderr_tail"))
        for key in ("median_iter_s", "env_steps_per_s", "startup_s", "peak_rss_mb"):
            assert math.isfinite(r[key]) and r[key] > 0, (name, key, r[key])
        assert len(r["iter_s"]) == 1
    assert math.isfinite(res["timerl-jax"]["compile_s"])
    out = peers.table(cfg, {**res, "rllib": {"error": "no venv in tests"}})
    lines = out.splitlines()
    for name in names:
        row = next(line for line in lines if line.startswith(name))
        assert "FAILED" not in row and "nan" not in row
    assert any(line.startswith("rllib") and "FAILED: no venv in tests" in line for line in lines)


def test_unknown_peer_is_refused(peers) -> None:  # noqa: ANN001
    with pytest.raises(SystemExit, match="unknown peers"):
        peers.run(peers.Config(peers="timerl-jax,nope"))

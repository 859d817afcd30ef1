"""LoopTune PPO training measured in this process vs on a measurement farm (issue 35).

Runs ``examples/ppo_looptune.py``'s training (``ppo_run.train``: seed demonstrations, then
PPO) twice with the same arguments, once measuring in this process and once on a
``--workers``-worker farm (a local Ray; ``--address`` for a cluster), each with an empty
measurement cache (a fresh ``XDG_CACHE_HOME``; the machine's peak copied in), and prints
the mean return per iteration of both, the real measurements each made and measurements
per second of training.

    taskset -c 1 python benchmarks/looptune_farm.py --measurer tvm --iterations 6
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import ppo_looptune  # noqa: E402

from timerl.envs.looptune import dataset, ppo_run  # noqa: E402
from timerl.envs.looptune.measure import default_cache_dir  # noqa: E402


def run(args: ppo_looptune.Args, label: str) -> dict:
    """Train once with an empty cache; the curve, measurements and seconds."""
    envs: list = []
    make = ppo_run.make_env

    def capture(*a: object, **k: object) -> object:
        env = make(*a, **k)  # type: ignore[arg-type]
        envs.append(env)
        return env

    peak = default_cache_dir() / "peak.json"
    with tempfile.TemporaryDirectory(prefix="timerl-farm-bench-") as tmp:
        old = os.environ.get("XDG_CACHE_HOME")
        os.environ["XDG_CACHE_HOME"] = tmp
        if peak.exists():
            (Path(tmp) / "timerl" / "looptune").mkdir(parents=True)
            shutil.copy(peak, default_cache_dir() / "peak.json")
        ppo_run.make_env = capture
        try:
            name = args.env_id.split(".", 1)[1]
            train_all, _ = dataset.split(name, seed=0)
            problems = ppo_run.subset(train_all, args.train_problems, args.seed)
            t0 = time.perf_counter()
            means, speedups = ppo_run.train(args, problems, say=lambda m: print(label, m, flush=True))
            seconds = time.perf_counter() - t0
        finally:
            ppo_run.make_env = make
            if old is None:
                del os.environ["XDG_CACHE_HOME"]
            else:
                os.environ["XDG_CACHE_HOME"] = old
    meas = envs[0].measurer
    measured = meas.stats.measured if hasattr(meas, "stats") else len(meas._mem)  # analytic: its cache
    stats = getattr(meas, "stats", None)
    measure_s = sum(stats.total_s) if stats is not None else None  # local: per schedule; farm: per batch
    out = {
        "label": label,
        "means": [round(m, 4) for m in means],
        "speedups": [round(s, 3) for s in speedups],
        "seconds": round(seconds, 1),
        "measured": measured,
        "measurements_per_s": round(measured / seconds, 2) if measured else None,
        "measure_s": round(measure_s, 1) if measure_s is not None else None,
        "measurements_per_measure_s": round(measured / measure_s, 2) if measure_s else None,
    }
    if args.ray_address:
        farm = ppo_run.farm_of(args).start()
        out["farm"] = str(farm.stats)
        out["placement"] = [(p["node"][:8], p["cpu"]) for p in farm.placement]
        farm.close()
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--measurer", default="analytic", choices=["analytic", "tvm"])
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--train-problems", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--address", default="local")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", choices=["local", "farm"], default=None)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    base = dict(
        measurer=a.measurer,
        iterations=a.iterations,
        num_envs=a.num_envs,
        train_problems=a.train_problems,
        seed=a.seed,
        progress=False,
        quiet=True,
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="timerl-farm-bench-out-") as out:
        if a.only in (None, "local"):
            results.append(run(ppo_looptune.Args(**base, out_dir=out + "/local"), "local"))
        if a.only in (None, "farm"):
            fargs = ppo_looptune.Args(
                **base, out_dir=out + "/farm", ray_address=a.address, farm_workers=a.workers
            )
            results.append(run(fargs, "farm"))
    if len(results) == 2:
        lo, fa = results
        same = lo["means"] == fa["means"]
        print(f"same curve: {same}; measurements/s farm / local: ", end="")
        print(
            f"{fa['measurements_per_s'] / lo['measurements_per_s']:.2f}"
            if lo["measurements_per_s"]
            else "n/a"
        )


if __name__ == "__main__":
    main()

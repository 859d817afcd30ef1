"""Memory with and without deallocation statements (``CompileOptions(dealloc=True)``).

Runs ``examples/ppo.py``'s fixed-rollout PPO (``build_fixed``: ``--num-envs`` CartPole envs x
``--num-steps`` steps per iteration, one epoch, ``--num-minibatches`` minibatches) once with
``dealloc=False`` and once with ``dealloc=True``, each in its own subprocess (so the maximum
RSS is its own), and reports per run: compile time, the median iteration time, the store's
peak bytes (the runtime's own accounting, ``memory_stats()``) per pool, the largest
tensors at their peak, the process's maximum RSS, and whether the rollouts sunk (rewards
and done flags of every step) are identical. Then the ratios off / on.

    python benchmarks/memory_dealloc.py --backend torch              # 512 x 250, 3 iterations
    python benchmarks/memory_dealloc.py --backend jax --num-envs 64 --num-steps 128

Timings on a shared machine are noisy; compare the ratios printed by one invocation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(cfg: dict) -> dict:
    """One run in this process: compile, execute, report (JSON-able)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import ppo  # noqa: PLC0415

    from timerl.schedule.ast import Dealloc, walk  # noqa: PLC0415

    args = ppo.Args(
        backend=cfg["backend"],
        num_envs=cfg["num_envs"],
        num_steps=cfg["num_steps"],
        iterations=cfg["iterations"],
        num_minibatches=cfg["num_minibatches"],
        seed=cfg["seed"],
    )
    digest = hashlib.sha256()
    stamps: list[float] = []

    def log_fn(v, pt) -> None:
        digest.update(v.tobytes())
        stamps.append(time.perf_counter())

    t0 = time.perf_counter()
    ex = ppo.build_fixed(args, log_fn, dealloc=cfg["dealloc"])
    compile_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    ex.execute()
    run_s = time.perf_counter() - t1
    its = [b - a for a, b in zip([t1, *stamps], stamps, strict=False)]
    st = ex.memory_stats(top=5)
    return {
        "compile_s": compile_s,
        "run_s": run_s,
        "iteration_s": statistics.median(its[1:] or its),
        "peak_bytes": st.peak_bytes,
        "live_bytes": st.live_bytes,
        "device_peak": st.pool("device").peak_bytes,
        "host_peak": st.pool("host").peak_bytes,
        "max_rss": st.max_rss_bytes,
        "top": [(t.label[:60], t.peak_bytes) for t in st.tensors],
        "digest": digest.hexdigest(),
        "frees": sum(isinstance(x, Dealloc) for x in walk(ex.schedule.ast)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="torch")
    p.add_argument("--num-envs", type=int, default=512)
    p.add_argument("--num-steps", type=int, default=250)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", default="")
    a = p.parse_args()
    if a.child:
        print("RESULT " + json.dumps(child(json.loads(a.child))), flush=True)
        return
    base = {
        "backend": a.backend,
        "num_envs": a.num_envs,
        "num_steps": a.num_steps,
        "iterations": a.iterations,
        "num_minibatches": a.num_minibatches,
        "seed": a.seed,
    }
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    res = {}
    for flag in (False, True):
        cfg = {**base, "dealloc": flag}
        out = subprocess.run(
            [sys.executable, __file__, "--child", json.dumps(cfg)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.stderr.write(out.stdout[-2000:] + out.stderr[-4000:])
            raise SystemExit(f"the run with dealloc={flag} failed")
        res[flag] = json.loads(line[len("RESULT ") :])
    mib = 1 << 20
    print(
        f"PPO {a.backend}: {a.num_envs} envs x {a.num_steps} steps, {a.iterations} iterations, M = {a.num_minibatches}"
    )
    for flag in (False, True):
        r = res[flag]
        print(
            f"dealloc={flag!s:5}  compile {r['compile_s']:6.2f} s  iteration {r['iteration_s']:6.2f} s  "
            f"store peak {r['peak_bytes'] / mib:8.1f} MiB (device {r['device_peak'] / mib:.1f}, host "
            f"{r['host_peak'] / mib:.1f}), {r['frees']} frees  live at end {r['live_bytes'] / mib:7.1f} MiB  max RSS {r['max_rss'] / mib:7.0f} MiB"
        )
        for label, b in r["top"][:3]:
            print(f"    {b / mib:8.1f} MiB  {label}")
    off, on = res[False], res[True]
    print(
        f"ratios off/on: store peak {off['peak_bytes'] / max(on['peak_bytes'], 1):.2f}x  "
        f"max RSS {off['max_rss'] / max(on['max_rss'], 1):.2f}x  "
        f"compile {off['compile_s'] / on['compile_s']:.2f}x  iteration {off['iteration_s'] / on['iteration_s']:.2f}x  "
        f"same rollouts: {off['digest'] == on['digest']}"
    )


if __name__ == "__main__":
    main()

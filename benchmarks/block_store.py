"""Block store vs point store, same program, same seed, same process.

Programs: ``reinforce`` (``examples/reinforce.py``: MC returns ``r[t:T]``, or n-step
``r[t:min(t+n, T)]`` with ``--n``, plus the gradient sums over ``0:T``), ``ppo``
(``examples/ppo.py``), and ``returns`` (a synthetic episode of ``--length`` steps with a
dynamic bound: ``g = r[t:T].discounted_sum(0.99)``, ``g[0:T].sum(0)``, random rewards of
16 envs; isolates the slice reads that REINFORCE does per step).

Each configuration is compiled with ``block_store=False`` and ``block_store=True``, run once
cold (jit compilation and env creation included; the point store runs first, so it also
pays for the kernels both share), then ``--repeats`` more times, the configurations
interleaved; the median wall and CPU times (CPU: all threads, less
sensitive to other jobs on the machine) and the store's peak bytes are reported. The
returns must agree.

    python benchmarks/block_store.py --program reinforce --iterations 12 --repeats 3
    python benchmarks/block_store.py --program returns --length 500
    python benchmarks/block_store.py --program ppo --iterations 4
    python benchmarks/block_store.py --program returns --backend jax --jax-blocks host
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import ppo  # noqa: E402
import reinforce  # noqa: E402

import timerl as trl  # noqa: E402


def build_returns(backend: str, length: int, iterations: int, log_fn: Any, **options: Any) -> Any:
    """The synthetic program: episodes of ``length`` steps found by a done signal."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        r = trl.rand((16,), domain=(i, t))
        g = r[i, t:T].discounted_sum(0.99)
        g[i, 0:T].sum(0).sink(log_fn)
        done = trl.as_tensor(t >= length - 1, dtype=trl.bool_)
    return ctx.compile({I: iterations, T: done}, backend=backend, **options)


def build(a: argparse.Namespace, backend: str, block_store: bool, log_fn: Any) -> Any:
    if a.program == "returns":
        return build_returns(backend, a.length, a.iterations, log_fn, block_store=block_store)
    orig = trl.Context.compile

    def compile_with(self, bounds, **kw):
        return orig(self, bounds, block_store=block_store, **kw)

    trl.Context.compile = compile_with
    try:
        if a.program == "reinforce":
            args: Any = reinforce.Args(backend=backend, iterations=a.iterations, num_envs=a.num_envs, n=a.n)
            return reinforce.build(args, log_fn)
        return ppo.build(ppo.Args(backend=backend, iterations=a.iterations, num_envs=a.num_envs), log_fn)
    finally:
        trl.Context.compile = orig


def compare(a: argparse.Namespace, backend: str) -> dict[str, Any]:
    rets: dict[bool, dict[int, list[float]]] = {False: {}, True: {}}
    exs, cold, times = {}, {}, {False: [], True: []}
    for flag in (False, True):

        def log_fn(v: Any, p: dict[str, int], flag: bool = flag) -> None:
            rets[flag].setdefault(p["i"], []).append(float(np.sum(v)))

        exs[flag] = build(a, backend, flag, log_fn)
        if hasattr(exs[flag].backend, "host_blocks"):  # JAX: device buffers or host NumPy ones
            exs[flag].backend.host_blocks = a.jax_blocks == "host"
        t0 = time.perf_counter()
        exs[flag].execute()
        cold[flag] = time.perf_counter() - t0
    first = {f: {k: list(v) for k, v in rets[f].items()} for f in (False, True)}
    for _ in range(a.repeats):
        for flag in (False, True):
            rets[flag].clear()
            t0, c0 = time.perf_counter(), time.process_time()
            exs[flag].execute()
            times[flag].append((time.perf_counter() - t0, time.process_time() - c0))
    out: dict[str, Any] = {"same": first[False] == first[True] and rets[False] == rets[True]}
    for flag, name in ((False, "point"), (True, "block")):
        m = exs[flag].memory_stats()
        out[name] = {
            "cold": cold[flag],
            "wall": statistics.median(x[0] for x in times[flag]),
            "cpu": statistics.median(x[1] for x in times[flag]),
            "peak": m.peak_bytes,
            "block_bytes": m.block_bytes,
        }
    means = [float(np.mean(v)) for _, v in sorted(first[False].items())]
    out["returns"] = means
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--program", choices=["reinforce", "ppo", "returns"], default="reinforce")
    p.add_argument("--backend", choices=["jax", "torch", "both"], default="both")
    p.add_argument("--iterations", type=int, default=6)
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--n", type=int, default=0, help="REINFORCE n-step window (0: Monte-Carlo)")
    p.add_argument("--length", type=int, default=500, help="episode length of the returns program")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per configuration after the cold one")
    p.add_argument(
        "--jax-blocks",
        choices=["device", "host"],
        default="device",
        help="JAX block buffers: device arrays updated by a donated jitted write, or host NumPy arrays",
    )
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for be in ["jax", "torch"] if a.backend == "both" else [a.backend]:
        r = compare(a, be)
        pt, bl = r["point"], r["block"]
        what = f"length={a.length}" if a.program == "returns" else f"n={a.n} envs={a.num_envs}"
        blocks = f" jax_blocks={a.jax_blocks}" if be == "jax" else ""
        print(f"{a.program} backend={be} iterations={a.iterations} {what} repeats={a.repeats}{blocks}")
        if a.program != "returns":
            print(f"  mean return per iteration: {' '.join(f'{x:.1f}' for x in r['returns'])}")
        for name, m in (("point", pt), ("block", bl)):
            print(
                f"  {name} store: cold {m['cold']:.2f}s  wall {m['wall']:.2f}s  cpu {m['cpu']:.2f}s  "
                f"peak {m['peak'] / 2**20:.2f} MiB  (block buffers at the end {m['block_bytes'] / 2**20:.2f} MiB)"
            )
        print(
            f"  point/block: wall {pt['wall'] / bl['wall']:.2f}x  cpu {pt['cpu'] / bl['cpu']:.2f}x;  "
            f"peak bytes block/point {bl['peak'] / pt['peak']:.3f};  "
            f"same returns: {r['same']}",
            flush=True,
        )


if __name__ == "__main__":
    main()

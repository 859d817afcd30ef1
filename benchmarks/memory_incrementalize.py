"""Memory and time with and without incrementalization (``CompileOptions(incrementalize=...)``).

Two programs, each built twice in one process (without the pass and with
``--threshold``), run alternately ``--warmup`` (uncounted: regions compile) plus
``--rounds`` times each; printed per setting: compile time, the median run time and
iteration time, the store's peak bytes (``memory_stats()``), the block dims the pass added,
and whether the sunk values are identical (PPO: the rollouts) or close (REINFORCE: the
sums). Then the ratios without / with.

* ``ppo``: ``examples/ppo.py``'s fixed-rollout PPO (``build_fixed``; default 512 envs x 250
  steps, 4 minibatches, 3 iterations). The weight-gradient contractions over the
  minibatch's rows (and the forward and backward passes feeding them) run in blocks.
* ``reinforce``: Monte-Carlo style, a (128, 128) per-step tensor of a recurrence summed
  over ``0:T`` per iteration (``--steps`` T), with ``vectorize_time`` on (the default: the
  per-step tensor is vectorized over t and read whole by the sum, so the pass finds nothing
  to tile) and off (the sum gathers T stored points; with the pass, one block at a time).

    python benchmarks/memory_incrementalize.py ppo --backend torch
    python benchmarks/memory_incrementalize.py reinforce --backend torch --steps 500

Timings on a shared machine are noisy; compare the ratios printed by one invocation.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def _ppo(a: argparse.Namespace, threshold: str | None, st: dict) -> Any:
    sys.path.insert(0, str(ROOT / "examples"))
    import ppo  # noqa: PLC0415

    args = ppo.Args(
        backend=a.backend,
        num_envs=a.num_envs,
        num_steps=a.num_steps,
        iterations=a.iterations,
        num_minibatches=a.num_minibatches,
        seed=0,
    )

    def log_fn(v, pt) -> None:
        st["digest"].update(np.asarray(v).tobytes())
        st["stamps"].append(time.perf_counter())

    return ppo.build_fixed(args, log_fn, incrementalize=threshold)


def _reinforce(a: argparse.Namespace, threshold: str | None, st: dict, vectorize_time: bool) -> Any:
    import timerl as trl  # noqa: PLC0415

    f = 128
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        s = trl.empty((f,), domain=(i, t), name="s")
        s[i, 0] = trl.const(np.linspace(-1, 1, f).astype(np.float32)) + trl.as_tensor(i) * 0.1
        s[i, t + 1] = (s * 0.9 + 0.05).tanh()
        x = (s.unsqueeze(1) * s.unsqueeze(0)).tanh()  # (f, f) per step: 64 KiB

        def sink(v, pt) -> None:
            st["values"].append(np.asarray(v, np.float64))
            st["stamps"].append(time.perf_counter())

        x[i, 0:T].sum(0).sink(sink, name="total")
    return ctx.compile(
        {I: a.iterations, T: a.steps},
        backend=a.backend,
        incrementalize=threshold,
        vectorize_time=vectorize_time,
    )


def _measure(build: Callable[[str | None, dict], Any], a: argparse.Namespace, title: str) -> None:
    state: dict[str | None, dict] = {}
    for thr in (None, a.threshold):
        st: dict = {"digest": hashlib.sha256(), "stamps": [], "values": []}
        t0 = time.perf_counter()
        ex = build(thr, st)
        st.update(ex=ex, compile_s=time.perf_counter() - t0, runs=[], its=[], digests=set(), outs=[])
        state[thr] = st
    for r in range(a.warmup + a.rounds):
        for thr in (None, a.threshold):
            st = state[thr]
            st["digest"], st["stamps"], st["values"] = hashlib.sha256(), [], []
            t1 = time.perf_counter()
            st["ex"].execute()
            st["digests"].add(st["digest"].hexdigest())
            st["outs"] = list(st["values"])
            if r < a.warmup:
                continue
            st["runs"].append(time.perf_counter() - t1)
            stamps = [t1, *st["stamps"]]
            st["its"] += [b - c for c, b in zip(stamps, stamps[1:], strict=False)]
    print(title)
    res = {}
    for thr in (None, a.threshold):
        st = state[thr]
        ex = st["ex"]
        m = ex.memory_stats(top=3)
        blocks = [f"{d.name} < {ex.pdg.static_bounds[b]}" for d, b in ex.pdg.dims if d.name.startswith("di")]
        res[thr] = {
            "run": statistics.median(st["runs"]),
            "it": statistics.median(st["its"]),
            "peak": m.peak_bytes,
        }
        print(
            f"incrementalize={thr!s:6}  compile {st['compile_s']:6.2f} s  run {res[thr]['run']:6.2f} s  "
            f"iteration {res[thr]['it']:6.3f} s  store peak {m.peak_bytes / MIB:8.2f} MiB  "
            f"block dims {blocks or '-'}"
        )
        for t in m.tensors:
            print(f"    {t.label[:70]}: peak {t.peak_bytes / MIB:.2f} MiB")
    off, on = res[None], res[a.threshold]
    same = state[None]["digests"] == state[a.threshold]["digests"] and len(state[None]["digests"]) == 1
    outs = [np.stack(state[k]["outs"]) if state[k]["outs"] else None for k in (None, a.threshold)]
    close = "n/a" if outs[0] is None else np.allclose(outs[0], outs[1], rtol=1e-4, atol=1e-4)
    print(
        f"ratios without/with: store peak {off['peak'] / max(on['peak'], 1):.3f}x  run {off['run'] / on['run']:.3f}x  "
        f"iteration {off['it'] / on['it']:.3f}x  same sunk bytes: {same}  sums close: {close}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("program", choices=("ppo", "reinforce"))
    p.add_argument("--backend", default="torch")
    p.add_argument("--threshold", default=None, help="bytes (default 2MiB for ppo, 1MiB for reinforce)")
    p.add_argument("--num-envs", type=int, default=512)
    p.add_argument("--num-steps", type=int, default=250)
    p.add_argument("--num-minibatches", type=int, default=4)
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--steps", type=int, default=500, help="reinforce: T")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=1, help="uncounted runs first (JIT compiles)")
    a = p.parse_args()
    if a.program == "ppo":
        a.threshold = a.threshold or "2MiB"
        _measure(
            lambda thr, st: _ppo(a, thr, st),
            a,
            f"PPO {a.backend}: {a.num_envs} envs x {a.num_steps} steps, M = {a.num_minibatches}, "
            f"{a.iterations} iterations, {a.rounds} timed runs each after {a.warmup} warm-up (alternated)",
        )
    else:
        a.threshold = a.threshold or "1MiB"
        for vt in (True, False):
            _measure(
                lambda thr, st, vt=vt: _reinforce(a, thr, st, vt),
                a,
                f"REINFORCE-style sum over 0:T {a.backend}: T = {a.steps}, {a.iterations} iterations, "
                f"vectorize_time={vt}, {a.rounds} timed runs each after {a.warmup} warm-up (alternated)",
            )


if __name__ == "__main__":
    main()

"""Peak store bytes of an n-step REINFORCE-shaped program at two episode lengths (issue 33).

The program (:func:`nstep_program`): iterations ``i``, steps ``t``; an environment UDF
(not differentiable) gives observations of ``--obs`` floats, a one-hot action chosen from
the detached logits, a reward and a done flag; a linear policy ``logits = o @ w`` reads the
observations; the per-step surrogate ``r = log_softmax(logits)[a] * reward`` is summed over
the window ``g = r[t:min(t + n, T)].sum()``, the loss is ``-g``, SGD updates ``w``. The
episode length is either static (``T: length``) or dynamic (``T: done``, the flag turning
true at step ``length - 1``).

Prints, per backend, T kind and T, the store's peak bytes with the default options and with
``memory_budget=--budget`` (or the ``MemoryBudgetError`` raised), the budget's estimate (a
dynamic ``T``: at ``T = 128``, ``plan.peak.dynamic_growth``) and the options it chose, and whether the trained weights equal the default's (``allclose``).

    python benchmarks/memory_nstep.py                               # both backends, T = 100, 1000
    python benchmarks/memory_nstep.py --backends torch --lengths 100 1000 --budget 4MB
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

N_ACTIONS = 2


def nstep_program(
    length: int,
    dynamic: bool,
    sink: Any,
    n: int | None = 8,
    obs: int = 4096,
    iterations: int = 2,
    lr: float = 1e-3,
) -> tuple[Any, dict]:
    """The n-step REINFORCE-shaped program (module doc); ``sink(w, point)`` gets the weights
    of every iteration; ``n=None``: Monte-Carlo REINFORCE, ``g = logp * reward[t:T].sum()``
    (the paper's Fig. 11 pair, ``benchmarks/memory_mc_nstep.py``). Returns the context and
    its bounds."""
    import timerl as trl  # noqa: PLC0415

    rng = np.random.default_rng(0)
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        w = trl.param(rng.normal(0, 0.01, (obs, N_ACTIONS)).astype(np.float32), domain=(i,), name="w")
        o = trl.empty((obs,), domain=(i, t), name="obs")
        o[i, 0] = trl.const(rng.normal(0, 1, obs).astype(np.float32)) + trl.as_tensor(i)
        logits = o @ w

        def step(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
            x, lg = ins
            act = int(np.argmax(lg) if (pt["t"] + pt["i"]) % 3 else np.argmin(lg))
            onehot = np.zeros(N_ACTIONS, np.float32)
            onehot[act] = 1.0
            nxt = (x * np.float32(0.9) + np.float32(0.1 * (act + 1))).astype(np.float32)
            reward = np.float32(1.0 if act == pt["t"] % 2 else -0.5)
            return [nxt, onehot, reward, np.array(pt["t"] + 1 >= length)]

        specs = [((obs,), trl.float32), ((N_ACTIONS,), trl.float32), ((), trl.float32), ((), trl.bool_)]
        nxt, onehot, reward, done = trl.udf(
            step, specs, domain=(i, t), inputs=[o, logits.detach()], name="env"
        )
        o[i, t + 1] = nxt
        logp = (trl.log_softmax(logits, -1) * onehot).sum()
        if n is None:  # REINFORCE: the log-probability times the return over the rest of the episode
            g = logp * reward[i, t:T].sum(0)
        else:
            r = logp * reward
            g = r[i, t : trl.min(t + n, T)].sum(0)
        (-g).backward()
        trl.optim.SGD([w], lr=lr).step()
        w.sink(sink)
    return ctx, {I: iterations, T: done if dynamic else length}


def run(length: int, dynamic: bool, backend: str, n: int, obs: int, **options: Any) -> tuple[Any, list]:
    """Compile and run the program once; the executor and the sunk weights."""
    got: list = []
    ctx, bounds = nstep_program(length, dynamic, lambda v, p: got.append(np.array(v)), n=n, obs=obs)
    ex = ctx.compile(bounds, backend=backend, **options)
    ex.execute()
    return ex, got


def main() -> None:
    from timerl.errors import MemoryBudgetError  # noqa: PLC0415
    from timerl.plan.peak import dynamic_growth  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", default=["jax", "torch"])
    p.add_argument("--lengths", nargs="+", type=int, default=[100, 1000])
    p.add_argument("--kinds", nargs="+", default=["static", "dynamic"], choices=["static", "dynamic"])
    p.add_argument("--budget", default="4MB", help="memory_budget of the second setting")
    p.add_argument("--n", type=int, default=8, help="window of the returns")
    p.add_argument("--obs", type=int, default=4096, help="floats per observation")
    a = p.parse_args()
    mb = 1e6
    print(f"{'backend':7} {'T':>13} | {'default peak':>12} | {'budget peak':>12} {'estimate':>9}  chosen")
    for backend in a.backends:
        for kind in a.kinds:
            for length in a.lengths:
                t0 = time.perf_counter()
                base, want = run(length, kind == "dynamic", backend, a.n, a.obs)
                row = f"{backend:7} {kind:>7} {length:5} | {base.memory_stats().peak_bytes / mb:9.2f} MB |"
                try:
                    ex, got = run(length, kind == "dynamic", backend, a.n, a.obs, memory_budget=a.budget)
                except MemoryBudgetError as exc:
                    print(f"{row} MemoryBudgetError: {str(exc).splitlines()[0][:90]}")
                    continue
                same = len(got) == len(want) and all(
                    np.allclose(x, y, rtol=1e-4, atol=1e-6) for x, y in zip(got, want, strict=True)
                )
                growth = dynamic_growth(ex.plan)  # dynamic T: the estimate at T = 128
                est = (ex.plan.peak.peak_bytes if growth is None else growth.peaks[-1]) / mb
                chosen = {
                    k: getattr(ex.options, k)
                    for k in ("dealloc", "accumulate", "incrementalize", "swap", "vectorize_dynamic")
                    if getattr(ex.options, k) != getattr(base.options, k)
                }
                print(
                    f"{row} {ex.memory_stats().peak_bytes / mb:9.2f} MB {est:6.2f} MB  {chosen or 'as given'}"
                    f"  weights equal: {same}  ({time.perf_counter() - t0:.1f} s)"
                )


if __name__ == "__main__":
    main()

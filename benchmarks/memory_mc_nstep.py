"""Monte-Carlo vs n-step learning under a memory budget (the paper's Fig. 11; issue 33 item 3).

The program is ``benchmarks/memory_nstep.py``'s (observations of ``--obs`` floats from an
environment UDF, a linear policy, SGD), with two return estimators:

* ``n-step``: ``r[t:min(t + n, T)].sum()``; under a budget the learner runs ``n - 1`` steps
  behind acting (running sums over the episode, ``accumulate``), holding ``O(n)``
  observations whatever ``T``;
* ``Monte-Carlo``: REINFORCE, the log-probability of each step's action times its return
  ``reward[t:T].sum()``: every step's gradient waits for the episode's end, so
  its observations are held (or swapped out) until then. Under a dynamic ``T`` no schedule
  bounds that (``MemoryBudgetError`` before running, printed); with a static ``T`` the
  budget swaps them to the host pool and incrementalizes the learner.

Each (algorithm, setting) is compiled with ``memory_timeline=True``, run once uncounted,
then ``--rounds`` times (median run time, per iteration). Prints device and host peaks,
iteration time, the options the budget chose and whether the weights equal the default
run's; writes each Plan's listing (``plan.pretty()``) and the timeline plot (device and
host pool per algorithm, default vs budget) to ``--out``.

    python benchmarks/memory_mc_nstep.py                      # torch, T = 300, 1 MB budget
    python benchmarks/memory_mc_nstep.py --backend jax --length 1000 --budget 2MB
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_nstep import nstep_program  # noqa: E402

ALGORITHMS = {"n-step": 8, "Monte-Carlo": None}
MIB = 1 << 20


def build(a: argparse.Namespace, n: int | None, dynamic: bool, sunk: list, **options: Any) -> Any:
    ctx, bounds = nstep_program(a.length, dynamic, lambda v, p: sunk.append(np.array(v)), n=n, obs=a.obs)
    return ctx.compile(bounds, backend=a.backend, memory_timeline=True, **options)


def measure(ex: Any, rounds: int, iterations: int) -> float:
    """Median seconds per iteration over ``rounds`` runs after an uncounted one."""
    times = []
    for r in range(rounds + 1):
        t0 = time.perf_counter()
        ex.execute()
        if r:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) / iterations


def main() -> None:
    from timerl.errors import MemoryBudgetError  # noqa: PLC0415

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="torch")
    p.add_argument("--length", type=int, default=300, help="episode length T")
    p.add_argument("--obs", type=int, default=4096, help="floats per observation")
    p.add_argument("--budget", default="1MB")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "runs" / "memory" / "mc_nstep"))
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    timelines: dict[tuple[str, str], Any] = {}
    print(f"{a.backend}, T = {a.length}, observations of {a.obs} floats, memory_budget={a.budget}")
    for alg, n in ALGORITHMS.items():
        base_sunk: list = []
        runs = {"default": build(a, n, True, base_sunk)}
        sunks = {"default": base_sunk}
        budget_sunk: list = []
        t0 = time.perf_counter()
        try:
            runs["budget"] = build(a, n, True, budget_sunk, memory_budget=a.budget)
            kind = "dynamic T"
        except MemoryBudgetError as exc:
            print(
                f"{alg:12} budget, dynamic T: MemoryBudgetError before running: {str(exc).splitlines()[0][:100]}"
            )
            budget_sunk.clear()
            runs["budget"] = build(a, n, False, budget_sunk, memory_budget=a.budget)
            kind = "static T"
        compile_s = time.perf_counter() - t0
        sunks["budget"] = budget_sunk
        for setting, ex in runs.items():
            sunks[setting].clear()
            secs = measure(ex, a.rounds, 2)
            st = ex.memory_stats()
            chosen = {
                k: getattr(ex.options, k)
                for k in ("accumulate", "incrementalize", "swap", "swap_threshold", "vectorize_dynamic")
                if setting == "budget" and getattr(ex.options, k) != getattr(runs["default"].options, k)
            }
            same = all(
                np.allclose(x, y, rtol=1e-4, atol=1e-6)
                for x, y in zip(sunks[setting], sunks["default"], strict=True)
            )
            label = f"{setting} ({kind})" if setting == "budget" else "default (dynamic T)"
            print(
                f"{alg:12} {label:19} device peak {st.pool('device').peak_bytes / MIB:7.2f} MiB  "
                f"host peak {st.pool('host').peak_bytes / MIB:7.2f} MiB  {secs * 1e3:8.1f} ms/iteration"
                + (f"  compile {compile_s:.1f} s  chose {chosen or 'as given'}  weights equal: {same}" if setting == "budget" else "")
            )  # fmt: skip
            timelines[(alg, setting)] = ex.memory_timeline()
            listing = out / f"{alg.lower()}_{setting}.txt"
            listing.write_text(ex.plan.pretty() + "\n")
    plot(timelines, a, out / "memory_mc_nstep.png")
    print(f"listings and plot in {out}")


def plot(timelines: dict[tuple[str, str], Any], a: argparse.Namespace, path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, axes = plt.subplots(1, len(ALGORITHMS), figsize=(11, 3.6), sharey=True)
    for ax, alg in zip(axes, ALGORITHMS, strict=True):
        for setting, colour in (("default", "tab:red"), ("budget", "tab:blue")):
            tl = timelines[(alg, setting)]
            ax.plot(
                tl.seconds,
                [x / MIB for x in tl.pool("device")],
                color=colour,
                lw=1,
                label=f"{setting}: device",
            )
            if any(tl.pool("host")):
                ax.plot(tl.seconds, [x / MIB for x in tl.pool("host")], color=colour, lw=1, ls="--",
                        label=f"{setting}: host")  # fmt: skip
        ax.set_title(f"{alg}, T = {a.length}")
        ax.set_xlabel("seconds into the run")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("live store bytes (MiB)")
    fig.suptitle(f"{a.backend}, observations of {a.obs} floats, memory_budget={a.budget}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

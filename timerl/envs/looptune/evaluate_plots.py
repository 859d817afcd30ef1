"""Plots of a LoopTune evaluation :class:`~.evaluate.Report`, in the style of the paper.

- :func:`plot_gflops_and_time` (Fig. 8): per problem, the GFLOPS each method reached
  (top, higher is better; untuned and NumPy as references) and its tuning seconds
  (bottom, log scale, lower is better);
- :func:`plot_speedups` (Fig. 9): per method, the distribution over problems of its
  speedup over the untuned nest (violins where there are enough distinct values,
  every problem as a dot).

Needs matplotlib (``pip install 'timerl[looptune]'``); draws off-screen (Agg).
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from timerl.errors import TimeRLError

if TYPE_CHECKING:
    from timerl.envs.looptune.evaluate import Report

__all__ = ["plot_gflops_and_time", "plot_speedups", "plot_steps"]


MAX_LABELLED = 60  # Fig. 8 names each problem on the x axis up to this many problems


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise TimeRLError("LoopTune plots need matplotlib: pip install 'timerl[looptune]'") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_gflops_and_time(report: Report, path: str | os.PathLike[str]) -> None:
    """Fig. 8: GFLOPS and tuning seconds of every method on every problem."""
    plt = _pyplot()
    rows = report.results
    x = list(range(len(rows)))
    labelled = len(rows) <= MAX_LABELLED
    width = max(6.0, 0.45 * len(rows) + 3) if labelled else 14.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(width, 7), sharex=True)
    top.plot(x, [r.untuned for r in rows], "k:", marker=".", label="untuned")
    top.plot(x, [r.numpy for r in rows], "k--", marker="_", label="numpy")
    markers = "osD^v<>ph*X"
    for i, m in enumerate(report.methods):
        mk = markers[i % len(markers)]
        top.plot(x, [r.gflops.get(m, math.nan) for r in rows], marker=mk, linestyle="none", label=m)
        secs = [r.seconds.get(m, math.nan) for r in rows]
        bottom.plot(x, [s if s > 0 else math.nan for s in secs], marker=mk, linestyle="none", label=m)
    top.set_ylabel("GFLOPS (higher is better)")
    top.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    top.grid(alpha=0.3)
    bottom.set_ylabel("tuning time, s (lower is better)")
    if any(s > 0 for r in rows for s in r.seconds.values() if math.isfinite(s)):
        from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

        bottom.set_yscale("log")
        bottom.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        bottom.yaxis.set_major_formatter(ScalarFormatter())
        bottom.yaxis.set_minor_formatter(NullFormatter())
    bottom.grid(alpha=0.3)
    if labelled:
        bottom.set_xticks(x)
        bottom.set_xticklabels(
            [r.problem.name.removeprefix("mm_") for r in rows], rotation=60, fontsize="small"
        )
        kernels = {r.problem.kernel for r in rows}
        dims = " x ".join(next(iter(kernels)).dims) if len(kernels) == 1 else "sizes"
        bottom.set_xlabel(f"problem ({dims})")
    else:
        bottom.set_xlabel(f"problem (index of {len(rows)}, in dataset order)")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def plot_speedups(report: Report, path: str | os.PathLike[str]) -> None:
    """Fig. 9: distribution of the speedup over the untuned nest, per method."""
    plt = _pyplot()
    methods = [*report.methods, "numpy"]
    data = []
    for m in methods:
        vals = [r.value(m) / r.untuned for r in report.results if r.untuned > 0 and math.isfinite(r.value(m))]
        data.append(vals)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(methods) + 2), 4.5))
    pos = list(range(1, len(methods) + 1))
    violin_pos = [p for p, d in zip(pos, data, strict=True) if len(set(d)) >= 2]
    if violin_pos:
        ax.violinplot([data[p - 1] for p in violin_pos], positions=violin_pos, showmedians=True)
    for p, d in zip(pos, data, strict=True):
        ax.plot([p] * len(d), d, "k.", alpha=0.6)
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_xticks(pos)
    ax.set_xticklabels(methods, rotation=30)
    ax.set_ylabel("speedup over the untuned nest")
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_steps(report: Report, path: str | os.PathLike[str]) -> None:
    """Fig. 10: after each action of a policy's greedy episode, the geomean over problems
    of the best GFLOPS so far over the untuned nest's (from the tuners' ``step_gflops``)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 4.0))
    for m in report.methods:
        curves = [r.info[m]["step_gflops"] for r in report.results if "step_gflops" in r.info.get(m, {})]
        curves = [c for c in curves if c and c[0] > 0]
        if not curves:
            continue
        steps = min(len(c) for c in curves)
        geo = [math.exp(sum(math.log(c[t] / c[0]) for c in curves) / len(curves)) for t in range(steps)]
        ax.plot(range(steps), geo, marker="o", label=f"{m} ({len(curves)} problems)")
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_xlabel("action")
    ax.set_ylabel("geomean speedup of the best schedule so far")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

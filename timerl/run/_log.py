"""``RunLog``: the progress bar, metrics files and learning curve of one training run;
``progress`` and ``write_csv`` for the long loops and result tables of other scripts."""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from timerl.errors import TimeRLError

log = logging.getLogger("timerl.run")
T = TypeVar("T")

NON_TTY_REFRESH_S = 30.0
"""Seconds between progress-bar updates when stderr is not a terminal (a log file, CI): each
update is a new line there, so a bar refreshed ten times a second fills the log."""


def _bar_options() -> dict[str, Any]:
    import sys

    tty = hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
    return {"dynamic_ncols": True, "mininterval": 0.1 if tty else NON_TTY_REFRESH_S}


def _summary_writer() -> Any:
    """tensorboardX's ``SummaryWriter``, without importing torch where nothing has yet.

    tensorboardX imports torch when it can, only to accept torch tensors as values: in a JAX
    run that took 3 s and ~200 MB of memory (``import tensorboardX`` alone: 227 MB peak RSS)
    for scalars that are floats. Where torch is not loaded, the import runs with torch
    marked missing; where that fails, it runs as usual."""
    import sys

    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # ``import torch`` raises ImportError
        try:
            from tensorboardX import SummaryWriter

            return SummaryWriter
        except ImportError:
            for name in [n for n in sys.modules if n == "tensorboardX" or n.startswith("tensorboardX.")]:
                del sys.modules[name]
        finally:
            if sys.modules.get("torch", 0) is None:
                del sys.modules["torch"]
    from tensorboardX import SummaryWriter

    return SummaryWriter


class RunLog:
    """Progress bar, CSV + TensorBoard metrics and a learning curve for one training run.

    ``agents > 1`` (many agents in one program, ``--num-seeds``): each ``log`` names its
    agent; ``metrics.csv`` gets an ``agent`` column, TensorBoard one run per agent
    (``agent_<k>/``), the bar advances once every agent logged an iteration, and the
    learning curve shows every agent's curve with their mean +- std."""

    def __init__(
        self, out_dir: str | Path, total: int, desc: str = "train", quiet: bool = False, agents: int = 1
    ) -> None:
        from tqdm import tqdm

        SummaryWriter = _summary_writer()  # noqa: N806 - a class

        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.quiet = quiet
        self.t0 = time.perf_counter()
        self.bar = tqdm(total=total, desc=desc, unit="it", disable=quiet, **_bar_options())
        # while the bar shows, console log lines (warnings of the run) are written above it
        self._redirect: Any = None
        if not quiet:
            from tqdm.contrib.logging import logging_redirect_tqdm

            self._redirect = logging_redirect_tqdm()
            self._redirect.__enter__()
        self.agents = int(agents)
        if self.agents > 1:
            self.tbs = [SummaryWriter(str(self.out_dir / f"agent_{k}")) for k in range(self.agents)]
        else:
            self.tbs = [SummaryWriter(str(self.out_dir))]
        self.tb = self.tbs[0]
        self._logged: dict[int, int] = {}  # iteration -> agents that logged it
        self._csv_file = open(self.out_dir / "metrics.csv", "w", newline="")  # noqa: SIM115
        self._csv: Any = None
        self.rows: list[dict[str, float]] = []

    def log(self, step: int, line: str | None = None, agent: int | None = None, **metrics: float) -> None:
        """Record iteration ``step``'s metrics (and print ``line`` above the bar); with
        ``agents > 1``, those of ``agent``."""
        if (agent is None) != (self.agents == 1) or (agent is not None and not 0 <= agent < self.agents):
            raise TimeRLError(f"RunLog.log: agent={agent!r} for a run of {self.agents} agent(s)")
        row = {"iteration": float(step)}
        if agent is not None:
            row["agent"] = float(agent)
        row.update({k: float(v) for k, v in metrics.items()})
        row["time_s"] = round(time.perf_counter() - self.t0, 3)
        self.rows.append(row)
        path = self.out_dir / "metrics.csv"
        try:
            if self._csv is None:
                self._csv = csv.DictWriter(self._csv_file, fieldnames=list(row))
                self._csv.writeheader()
            self._csv.writerow({k: row.get(k, "") for k in self._csv.fieldnames})
            self._csv_file.flush()
            tb = self.tbs[agent or 0]
            for k, v in metrics.items():
                tb.add_scalar(k, float(v), step)
        except OSError as exc:  # a full disk: say which file, keep what was recorded
            raise TimeRLError(
                f"cannot write the metrics of iteration {step} to {path} (or the TensorBoard events "
                f"beside it): {exc}. The rows recorded so far are in RunLog.rows; the checkpoints "
                "written so far are complete (a resume continues from the latest)"
            ) from exc
        if line is not None:
            if self.quiet:
                print(line, flush=True)
            else:
                self.bar.write(line)
        self._logged[step] = self._logged.get(step, 0) + 1
        if self._logged[step] == self.agents:  # every agent logged this iteration
            del self._logged[step]
            self.bar.update(1)
            if "mean_return" in metrics:
                now = [r["mean_return"] for r in self.rows[-self.agents :] if "mean_return" in r]
                self.bar.set_postfix(mean_return=f"{float(np.mean(now)):.4g}", refresh=False)

    def _plot_agents(self, ax: Any, curve: str, x: str) -> None:
        """Every agent's curve (thin) and their mean +- std."""
        xs, ys = _agent_curves(self.rows, curve, x, self.agents)
        for k in range(self.agents):
            ax.plot(xs[k], ys[k], lw=0.6, alpha=0.35, color="tab:blue")
        mean, std = ys.mean(axis=0), ys.std(axis=0)
        ax.plot(xs[0], mean, lw=1.8, color="tab:blue", label=f"mean of {self.agents} agents")
        ax.fill_between(xs[0], mean - std, mean + std, alpha=0.2, color="tab:blue", label="+- std")
        ax.legend(fontsize=8)

    def close(self, curve: str | None = None, x: str = "iteration") -> Path | None:
        """Close the bar and files; plot ``curve`` against ``x`` to ``learning_curve.png``
        (returns its path; None without ``curve`` or rows)."""
        if self._redirect is not None:
            self._redirect.__exit__(None, None, None)
            self._redirect = None
        self.bar.close()
        for tb in self.tbs:
            tb.close()
        self._csv_file.close()
        if curve is None or not self.rows:
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.5))
        if self.agents == 1:
            ax.plot([r.get(x, 0.0) for r in self.rows], [r.get(curve, float("nan")) for r in self.rows])
        else:
            self._plot_agents(ax, curve, x)
        ax.set_xlabel(x.replace("_", " "))
        ax.set_ylabel(curve.replace("_", " "))
        ax.grid(alpha=0.3)
        fig.tight_layout()
        path = self.out_dir / "learning_curve.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        log.info("learning curve: %s", path)
        return path


def _agent_curves(
    rows: Sequence[Mapping[str, float]], curve: str, x: str, agents: int
) -> tuple[np.ndarray, np.ndarray]:
    """``x`` and ``curve`` per agent (rows: agents, columns: the iterations every agent logged)."""
    per: list[dict[float, tuple[float, float]]] = [{} for _ in range(agents)]
    for r in rows:
        per[int(r["agent"])][r["iteration"]] = (r.get(x, r["iteration"]), r.get(curve, float("nan")))
    common = sorted(set.intersection(*(set(p) for p in per)))
    xs = np.array([[p[it][0] for it in common] for p in per])
    ys = np.array([[p[it][1] for it in common] for p in per])
    return xs, ys


def progress(
    iterable: Iterable[T] | None = None,
    total: int | None = None,
    desc: str = "",
    quiet: bool = False,
    unit: str = "it",
) -> Any:
    """A progress bar with the time left (``tqdm``, on stderr) over ``iterable`` (or
    ``total`` steps, advanced with ``.update(1)``); ``quiet`` turns it off. Lines written
    with its ``.write(line)`` go to stdout above the bar. For the long loops of scripts that
    report tables rather than per-iteration metrics (evaluations, searches)."""
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=quiet, **_bar_options())


def write_csv(path: str | Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``rows`` (one dict each) as CSV to ``path``: the columns are every key, in the
    order first seen; a missing value is empty, a list or tuple its items joined by spaces.
    Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        for row in rows:
            w.writerow(
                {k: " ".join(map(str, v)) if isinstance(v, list | tuple) else v for k, v in row.items()}
            )
    return path

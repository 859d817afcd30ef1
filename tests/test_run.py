"""``timerl.run.RunLog``: CSV rows, TensorBoard events and the learning curve of a run."""

from __future__ import annotations

import csv
import logging
import subprocess
import sys
from dataclasses import dataclass

import pytest

import timerl as trl


def test_run_log_writes_metrics_events_and_curve(tmp_path, capsys) -> None:
    log = trl.run.RunLog(tmp_path / "r", total=3, desc="test", quiet=True)
    for k in range(3):
        log.log(k, f"line {k}", mean_return=10.0 * k, env_steps=100 * (k + 1))
    png = log.close(curve="mean_return", x="env_steps")
    rows = list(csv.DictReader(open(tmp_path / "r" / "metrics.csv")))
    assert [float(r["mean_return"]) for r in rows] == [0.0, 10.0, 20.0]
    assert [float(r["env_steps"]) for r in rows] == [100.0, 200.0, 300.0]
    assert png is not None and png.stat().st_size > 1000
    events = list((tmp_path / "r").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    data = events[0].read_bytes()
    assert b"mean_return" in data and b"env_steps" in data
    assert capsys.readouterr().out.splitlines() == ["line 0", "line 1", "line 2"]


def test_run_log_does_not_import_torch(tmp_path) -> None:
    """tensorboardX imports torch when it can (seconds and ~200 MB in a JAX run): RunLog keeps
    it out where nothing imported it, and torch still imports afterwards."""
    code = (
        "import sys, timerl as trl\n"
        f"log = trl.run.RunLog({str(tmp_path / 'r')!r}, total=1, quiet=True)\n"
        "log.log(0, None, x=1.0); log.close()\n"
        "assert 'torch' not in sys.modules, 'RunLog imported torch'\n"
        "import torch\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert b"x" in next((tmp_path / "r").glob("events.out.tfevents.*")).read_bytes()


@dataclass
class _Args(trl.run.RunArgs):
    lr: float = 1e-3
    """Adam learning rate"""
    out_dir: str = "runs/test"
    """where the run goes"""


def test_parse_args_types_bools_and_defaults(capsys) -> None:
    a = trl.run.parse_args(_Args, argv=["--lr", "0.5", "--quiet", "--show-schedule", "false"])
    assert (a.lr, a.quiet, a.show_schedule, a.out_dir, a.backend) == (0.5, True, False, "runs/test", "jax")
    b = trl.run.parse_args(_Args, _Args(backend="torch"), argv=["--checkpoint-every", "3"])
    assert (b.backend, b.checkpoint_every) == ("torch", 3)
    with pytest.raises(SystemExit):
        trl.run.parse_args(_Args, argv=["--quiet", "maybe"])
    with pytest.raises(SystemExit):  # a backend typo fails while parsing, before anything runs
        trl.run.parse_args(_Args, argv=["--backend", "jaxx"])
    assert "invalid choice: 'jaxx'" in capsys.readouterr().err


def test_field_docs_subclass_wins() -> None:
    docs = trl.run.field_docs(_Args)
    assert docs["out_dir"] == "where the run goes"
    assert docs["lr"] == "Adam learning rate"
    assert docs["resume"].startswith("continue from a checkpoint")


def test_show_schedule_writes_the_picture_into_the_run_directory(tmp_path, caplog) -> None:
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        (trl.as_tensor(t) + trl.as_tensor(i)).sink(lambda v, pt: None)
    args = _Args(out_dir=str(tmp_path), show_schedule=True, backend="torch")
    with caplog.at_level(logging.INFO, logger="timerl.run"):
        ex = trl.run.checkpoint_and_compile(ctx, args, None, i, {I: 2, T: 3})
    assert (tmp_path / "schedule.txt").stat().st_size > 0 and (tmp_path / "schedule.png").stat().st_size > 0
    assert "for i (" in caplog.text and str(tmp_path / "schedule.png") in caplog.text
    ex.execute()


def test_progress_bar_iterates_writes_and_can_be_quiet(capsys) -> None:
    bar = trl.run.progress(["a", "b"], desc="bench", unit="bench")
    seen = []
    for x in bar:
        bar.set_postfix_str(x)
        bar.write(f"done {x}")
        seen.append(x)
    assert seen == ["a", "b"]
    out, err = capsys.readouterr()
    assert out.splitlines() == ["done a", "done b"] and "bench" in err and "2/2" in err
    assert list(trl.run.progress(range(3), quiet=True)) == [0, 1, 2]
    assert capsys.readouterr().err == ""


def test_write_csv_takes_every_key_and_joins_lists(tmp_path) -> None:
    path = trl.run.write_csv(
        tmp_path / "sub" / "results.csv", [{"name": "a", "x": 1.5}, {"name": "b", "y": [1, 2], "x": 2}]
    )
    rows = list(csv.DictReader(open(path)))
    assert list(rows[0]) == ["name", "x", "y"]
    assert rows == [{"name": "a", "x": "1.5", "y": ""}, {"name": "b", "x": "2", "y": "1 2"}]


def test_run_log_writes_log_lines_above_its_bar_and_restores_the_handlers(tmp_path) -> None:
    root = logging.getLogger()
    console = logging.StreamHandler(sys.stderr)
    root.addHandler(console)
    try:
        before = list(root.handlers)
        log = trl.run.RunLog(tmp_path / "r", total=2, desc="test")
        assert console not in root.handlers  # tqdm's handler writes it above the bar instead
        log.log(0, mean_return=1.0)
        log.close()
        assert root.handlers == before
    finally:
        root.removeHandler(console)


def test_bars_write_few_updates_when_stderr_is_not_a_terminal(tmp_path, capsys) -> None:
    """In a log file every bar update is a new line: 200 quick iterations with a metric each
    write the bar a handful of times (start, end), not once per iteration."""
    run = trl.run.RunLog(tmp_path, 200, "train")
    for k in range(200):
        run.log(k, mean_return=float(k))
    run.close()
    err = capsys.readouterr().err
    assert "200/200" in err
    assert err.count("\r") < 10, err.count("\r")
    list(trl.run.progress(range(200), desc="tuning"))
    err = capsys.readouterr().err
    assert "200/200" in err and err.count("\r") < 10

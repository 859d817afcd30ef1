"""``timerl.run.RunLog``: CSV rows, TensorBoard events and the learning curve of a run."""

from __future__ import annotations

import csv

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

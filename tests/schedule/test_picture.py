"""``Executor.plot_schedule``: the schedule's loop nest and statement order as text and PNG."""

from __future__ import annotations

import timerl as trl
from timerl.schedule.ast import Exec, Loop, walk


def _program() -> tuple[trl.Context, dict]:
    """A backward recurrence over t (returns) per iteration i, and a sink."""
    ctx = trl.Context(dims=("i", "t"))
    with ctx as ((i, I), (t, T)):
        r = (trl.as_tensor(t) + trl.as_tensor(i)).cast(trl.float32)
        g = trl.empty((), domain=(i, t), name="returns")
        g[i, T - 1] = r[i, T - 1]
        g[i, t] = r + 0.5 * g[i, t + 1]
        g[i, 0].sink(lambda v, pt: None)
    return ctx, {I: 3, T: 4}


def test_plot_schedule_writes_loops_and_statements(tmp_path) -> None:
    ctx, bounds = _program()
    ex = ctx.compile(bounds, backend="torch")
    txt, png = ex.plot_schedule(tmp_path / "pics" / "schedule.png")
    assert (txt.name, png.name) == ("schedule.txt", "schedule.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2000
    text = txt.read_text()
    loops = [n for n in walk(ex.schedule.ast) if isinstance(n, Loop)]
    execs = [n for n in walk(ex.schedule.ast) if isinstance(n, Exec)]
    assert loops and execs
    # every loop is named by the dim it walks, and every statement appears, named, in order
    assert "for i (" in text and "for t (" in text
    assert "'returns' merge [i, t]" in text
    assert "test_picture.py:" in text and "g[i, t] = r + 0.5 * g[i, t + 1]" in text
    listed = [line for line in text.splitlines() if line.lstrip().startswith("exec %")]
    assert [int(line.split("%")[1].split("(")[0]) for line in listed] == [e.node for e in execs]
    assert all("  # " in line for line in listed)

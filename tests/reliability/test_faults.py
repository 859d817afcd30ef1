"""Faults outside the program (issue 38, item 4): a process killed while it writes a
checkpoint, a full disk under the metrics file. An environment that raises and a UDF that
returns the wrong shape are covered by ``tests/rt/test_user_code_errors.py`` and
``tests/reliability/test_ill_formed.py``.

Each fault gives a clear error (a ``TimeRLError`` naming what failed) or, for the kill, a
previous checkpoint that loads and resumes bit-exact.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from timerl.errors import TimeRLError

REPO = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent(
    """
    import json, os, signal, sys
    import numpy as np
    import timerl as trl

    def run(iters, ckpt, resume, kill_at, out_path, backend):
        out = {}
        ctx = trl.Context(dims=("i", "t"))
        with ctx as ((i, I), (t, T)):
            w = trl.param(np.array([0.3, -0.2], np.float32), domain=(i,), name="w")
            x = trl.empty((2,), domain=(i, t), name="x")
            x[i, 0] = w * 1.0
            x[i, t + 1] = (x * 0.9 + w * trl.as_tensor(t)).tanh()
            (x * x).sum().backward()
            trl.optim.Adam([w], lr=0.05).step()
            w.sink(lambda v, p: out.__setitem__(p["i"], np.array(v).tolist()))
            if ckpt:
                w.checkpoint(ckpt)
        if kill_at is not None:
            import timerl.runtime.checkpoint as C
            real = C.os.replace

            def replace(src, dst):
                # killed with ckpt_<kill_at>.npz in place and its .json not yet written
                if dst.endswith(f"ckpt_{kill_at}.json"):
                    os.kill(os.getpid(), signal.SIGKILL)
                real(src, dst)

            C.os.replace = replace
        extra = {"resume": resume} if resume else {}
        ctx.compile({I: iters, T: 3}, backend=backend, seed=1, **extra).execute()
        with open(out_path, "w") as f:
            json.dump({str(k): v for k, v in out.items()}, f)

    a = sys.argv
    run(int(a[1]), a[2], a[3], None if a[4] == "-" else int(a[4]), a[5], a[6])
    """
)


def _run(tmp: Path, backend: str, iters: int, ckpt: str = "", resume: str = "", kill_at: int | None = None):
    script = tmp / "prog.py"
    script.write_text(PROGRAM)
    out = tmp / f"out_{iters}_{bool(ckpt)}_{bool(resume)}_{kill_at}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = [str(iters), ckpt, resume, "-" if kill_at is None else str(kill_at), str(out), backend]
    proc = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    return proc, out


@pytest.mark.parametrize("backend", ["torch", "jax"])
def test_kill_during_checkpoint_write_keeps_the_previous_one(backend: str, tmp_path: Path) -> None:
    """Killed (SIGKILL) while writing the checkpoint of iteration 2: the checkpoint of
    iteration 1 is the latest complete one, a resume from the directory loads it, and the
    resumed run's parameters equal an uninterrupted run's bit for bit."""
    import json

    full, full_out = _run(tmp_path, backend, 5)
    assert full.returncode == 0, full.stderr[-2000:]
    want = json.loads(full_out.read_text())
    ck = tmp_path / "ckpt"
    killed, _ = _run(tmp_path, backend, 5, ckpt=str(ck), kill_at=2)
    assert killed.returncode == -9, (killed.returncode, killed.stderr[-2000:])
    names = sorted(os.listdir(ck))
    assert "ckpt_1.json" in names and "ckpt_1.npz" in names and "ckpt_2.json" not in names
    from timerl.runtime.checkpoint import pick_checkpoint, read_values

    assert pick_checkpoint(str(ck)).endswith("ckpt_1.json")
    assert read_values(str(ck))  # loadable
    resumed, res_out = _run(tmp_path, backend, 5, ckpt=str(ck), resume=str(ck))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got = json.loads(res_out.read_text())
    assert sorted(got) == ["2", "3", "4"]  # iterations 0 and 1 came from the checkpoint
    for k in got:
        assert np.array_equal(np.array(got[k], np.float32), np.array(want[k], np.float32)), k


def test_full_disk_while_writing_metrics(tmp_path: Path) -> None:
    """The metrics file on a full disk (``metrics.csv`` a link to ``/dev/full``: every write
    fails with ENOSPC): a ``TimeRLError`` naming the file, the iteration and the cause; the
    row stays in ``RunLog.rows``."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    from timerl.run import RunLog

    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.csv").symlink_to("/dev/full")
    run = RunLog(out, total=3, quiet=True)
    with pytest.raises(TimeRLError, match=r"iteration 0 to .*metrics\.csv.*No space left on device"):
        run.log(0, loss=1.0)
    assert [r["loss"] for r in run.rows] == [1.0]
    with pytest.raises(OSError):  # the file is still on the full disk
        run.close()

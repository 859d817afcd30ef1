"""ProgramRounds: one compiled RT program run round by round, paused by the program itself."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import timerl as trl
from timerl.envs.release.rounds import ProgramRounds


def _program(rounds: ProgramRounds, per: int, iters: int, seen: list, fail_at: int = -1):
    """x[i] = payload of i's round + i, through a UDF that pauses at each round's first i;
    the sink records (i, x). Compiled with ``iters`` iterations."""
    payload = [0.0]

    def fn(ins, point):
        i = point["i"]
        if i == fail_at:
            raise ValueError("boom")
        if i % per == 0:
            payload[0] = rounds.boundary()
        return [np.float32(payload[0] + i)]

    ctx = trl.Context(dims=("i",))
    with ctx as ((i, I),):
        (x,) = trl.udf(fn, [((), trl.float32)], (i,), name="paused")
        x.sink(lambda v, p: seen.append((p["i"], float(v))))
    return ctx.compile({I: iters}, backend="torch")


def test_rounds_run_one_at_a_time_with_payloads() -> None:
    """Each run_round runs exactly one round's iterations with its payload; the host sees a
    round's outputs complete when run_round returns; the end of the program is reported."""
    rounds, seen = ProgramRounds(), []
    rounds.start(_program(rounds, per=2, iters=6, seen=seen))
    rounds.run_round(100.0)
    assert seen == [(0, 100.0), (1, 101.0)]
    rounds.run_round(200.0)
    assert seen[2:] == [(2, 202.0), (3, 203.0)]
    assert not rounds.ended
    rounds.run_round(300.0)
    assert seen[4:] == [(4, 304.0), (5, 305.0)] and rounds.ended
    with pytest.raises(trl.TimeRLError, match="ran all its iterations after 3 rounds"):
        rounds.run_round(400.0)
    rounds.close()


def test_close_stops_a_paused_program() -> None:
    """Closing between rounds stops the program at its boundary and joins the worker thread."""
    rounds, seen = ProgramRounds(), []
    rounds.start(_program(rounds, per=2, iters=100, seen=seen))
    rounds.run_round(1.0)
    before = threading.active_count()
    rounds.close()
    assert threading.active_count() == before - 1
    assert [i for i, _ in seen] == [0, 1]  # nothing ran past the boundary of round 2


def test_error_in_program_is_raised_on_the_host() -> None:
    rounds, seen = ProgramRounds(), []
    rounds.start(_program(rounds, per=2, iters=6, seen=seen, fail_at=3))
    rounds.run_round(1.0)
    with pytest.raises(trl.TimeRLError, match="boom"):
        rounds.run_round(2.0)
    assert rounds.ended
    rounds.close()

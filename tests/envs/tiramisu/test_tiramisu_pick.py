"""``search.pick_best``: every evaluated method keeps its schedule by re-measuring its
fastest candidates and the untransformed program, not by one in-search measurement.

The timings here are scripted (a fake measurer): one lucky in-search measurement makes a
schedule that is slower than the untransformed program look fastest, and one of the
fresh re-measurements is lucky again. The schedules, legality and the eval's episode
replay are the real ones; the real measurer is exercised at the end."""

from __future__ import annotations

from timerl.envs.tiramisu import benchmarks as bm
from timerl.envs.tiramisu import evaluate as tiramisu_eval
from timerl.envs.tiramisu.actions import ACTIONS, NEXT
from timerl.envs.tiramisu.env import TiramisuTask
from timerl.envs.tiramisu.measure import Measurer
from timerl.envs.tiramisu.search import apply_sequence, beam_search, pick_best, random_search

BASE = 1.0


class ScriptedMeasurer:
    """Seconds by schedule key from ``times`` (default: the untransformed program's);
    ``lucky`` keys measure ``lucky[key]`` instead on this measurer."""

    threads = 1

    def __init__(self, times: dict[str, float], lucky: dict[str, float] | None = None) -> None:
        self.times, self.lucky = times, lucky or {}
        self.calls: list[str] = []

    def base_seconds(self, program) -> float:
        return BASE

    def seconds(self, sched) -> float:
        self.calls.append(sched.key)
        return self.lucky.get(sched.key, self.times.get(sched.key, BASE))


def _setup():
    prog = bm.heat2d(2, 24)
    slow, fast, mid = "0:U(4)", "0:U(8)", "0:U(4) 1:U(4)"
    probe = TiramisuTask(prog, Measurer(disk_cache=False, threads=1))  # keys only, nothing measured
    key = {spec: apply_sequence(probe, spec).key for spec in (slow, fast, mid)}
    true = {key[slow]: 1.25 * BASE, key[fast]: 0.8 * BASE, key[mid]: 0.9 * BASE}
    # in the episode, slow was measured once and came out lucky (0.7): the fastest of the episode
    shared = ScriptedMeasurer(true, lucky={key[slow]: 0.7 * BASE})
    return TiramisuTask(prog, shared), key, true


def test_one_lucky_measurement_no_longer_wins() -> None:
    task, key, true = _setup()
    name = {a.name: k for k, a in enumerate(ACTIONS)}
    ep = (name["U(4)"], name["U(8)"], NEXT)  # measures 0:U(4) (lucky), then 0:U(4) 0:U(8)
    _, first, measured = tiramisu_eval.replay(task, ep)
    assert first.key == key["0:U(4)"]  # the in-episode pick: the slower schedule
    slow_then_fast = next(s for k, s in measured.items() if k not in (task.initial.key, key["0:U(4)"]))
    fresh = iter(
        [  # the first fresh measurer is lucky on 0:U(4) again; the median of three is not
            ScriptedMeasurer({**true, slow_then_fast.key: 0.85}, lucky={key["0:U(4)"]: 0.6}),
            ScriptedMeasurer({**true, slow_then_fast.key: 0.85}),
            ScriptedMeasurer({**true, slow_then_fast.key: 0.85}),
        ]
    )
    pk = pick_best(task, measured.values(), top=3, repeats=3, new_measurer=lambda: next(fresh))
    assert pk.best.key == slow_then_fast.key
    assert abs(pk.speedup - 1 / 0.85) < 1e-9
    assert pk.candidates[0] == (task.initial.key, 1.0)  # the untransformed program, re-measured
    assert dict(pk.candidates)[key["0:U(4)"]] == 1 / 1.25  # median of 1/0.6, 1/1.25, 1/1.25
    assert pk.measurements == 3 * 3  # untransformed + 2 candidates, 3 repeats each


def test_untransformed_kept_unless_beaten_and_cache_shared() -> None:
    task, key, true = _setup()
    slow = apply_sequence(task, "0:U(4)")
    made: list[ScriptedMeasurer] = []

    def new() -> ScriptedMeasurer:
        made.append(ScriptedMeasurer(true))
        return made[-1]

    cache: dict[str, float] = {}
    pk = pick_best(task, [task.initial, slow], top=3, repeats=3, cache=cache, new_measurer=new)
    assert pk.best.key == task.initial.key and pk.speedup == 1.0  # slow re-measures at 0.8x
    assert pk.measurements == 2 * 3 and len(made) == 3
    # top=1 among three: only the fastest in-search candidate (the lucky slow one) and the
    # untransformed program are re-measured; a second method with the same candidates reuses
    # the cache (no new measurer) and is charged the same count
    fast = apply_sequence(task, "0:U(8)")
    pk1 = pick_best(task, [slow, fast, task.initial], top=1, repeats=3, cache=cache, new_measurer=new)
    assert [k for k, _ in pk1.candidates] == [task.initial.key, slow.key]
    assert pk1.best.key == task.initial.key and pk1.measurements == 6 and len(made) == 3


def test_searches_report_what_they_measured_and_pick_with_real_timing() -> None:
    m = Measurer(disk_cache=False, threads=1)
    task = TiramisuTask(bm.jacobi2d(2, 48), m)
    for search in (beam_search, random_search):
        res = search(task, 5)
        assert task.initial.key in {s.key for s in res.measured}
        assert len({s.key for s in res.measured}) <= res.measurements <= 5
        pk = pick_best(task, res.measured, top=2, repeats=2)
        assert pk.best.key in {s.key for s in res.measured}
        assert pk.candidates[0] == (task.initial.key, 1.0) and pk.speedup >= 1.0
        assert len(pk.candidates) == min(3, len(res.measured)) and pk.measurements == 2 * len(pk.candidates)

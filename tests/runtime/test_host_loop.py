"""A host loop's generated body (``timerl.runtime.host_loop``) against the plan it is
generated from, run by hand in plain Python."""

from __future__ import annotations

from typing import Any

from timerl.runtime.host_loop import SLOT, HostMember, generate


def _members() -> list[HostMember]:
    def env(ins: list[Any], state: int, v: int) -> tuple[int, list[Any]]:  # a pure form: state threaded
        return state + 1, [ins[0] * 10 + state, v]

    return [
        HostMember("kernel", lambda ins: ins[0] + ins[1] + ins[2]),  # x[it] + carry 0 + inv 0
        HostMember("pure", env),
        HostMember("step", lambda ins, state, v: [ins[0] - 1, ins[1] > 40]),  # a step and a done-signal
        HostMember("step", lambda ins, state, v: [ins[1]]),  # the setter: passes the signal on
    ]


PLAN = [
    [("xs", 0), ("carry", 0), ("inv", 0)],
    [("local", 0 * SLOT)],
    [("local", 1 * SLOT), ("local", 1 * SLOT + 1), ("unused", 0)],
    [("local", 2 * SLOT + 1), ("local", 2 * SLOT + 1)],
]


def _by_hand(carry: int, inv: int, xs: list[int], state: int, vals: list[int], kept: list[bool] | None):
    rows: list[list[Any]] = [[], []]
    count, done = 0, False
    for it, v in enumerate(vals):
        a = xs[it] + carry + inv
        out = a * 10 + state
        state += 1
        b, signal = out - 1, v > 40
        done = signal
        carry = b
        if kept is None or kept[it]:
            rows[0].append(b)
        rows[1].append(out)
        count += 1
        if done:
            break
    return state, rows, count, done


def test_the_generated_body_runs_the_plan() -> None:
    xs, vals = [3, 1, 4, 1, 5, 9], [38, 39, 40, 41, 42, 43]
    for kept in (None, [True, False, True, True, False, True]):
        loop = generate(PLAN, _members(), [(2, 0)], [(2, 0), (1, 0)], setter=3, all_true=bool)
        states, rows, count, done = loop((7,), (2,), (xs,), (None, 5, None, None), vals, [kept, None])
        state, want, n, stop = _by_hand(7, 2, xs, 5, vals, kept)
        assert (states[1], rows, count, done) == (state, want, n, stop)
        assert count == 4 and done  # the setter ended the loop at v = 41
    # without a setter the loop runs every value; the source names every member
    loop = generate(PLAN, _members(), [(2, 0)], [(2, 0)], setter=None, all_true=bool)
    _, rows, count, done = loop((7,), (2,), (xs,), (None, 5, None, None), vals, [None])
    assert count == len(vals) and not done and len(rows[0]) == len(vals)
    assert all(f"F{k}(" in loop.source for k in range(4))

"""A host loop's body as one generated Python function (the Torch backend's scans).

A backend that does not compile loops runs a scanned loop on the host: per iteration, each
member's prepared kernel on this iteration's values, the carry and the loop-invariant
inputs (``runtime/scan.py``, ``ScannedLoop._build_host``). Interpreting that plan per
iteration (a dict of values, a list of sources per input, a closure per member) cost ~100 us
per iteration of PPO's acting loop at 8 envs, as much as its matrix products. Here the plan
becomes straight-line Python once per loop: every value a local variable, every input an
expression (``x0[it]``, ``c1``, ``m3_0``), every member one call; CPython then runs the body
with no lookups but the calls themselves.

The generated source is logged at DEBUG (logger ``timerl.runtime.host_loop``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

SLOT = 16
"""A member's output ``oid`` is value ``k * SLOT + oid`` in a plan's ``local`` references."""


@dataclass(frozen=True)
class HostMember:
    """How the loop calls member ``k``: ``call(ins)`` returns its one output (``kind``
    'kernel'), or ``call(ins, state, v)`` returns its outputs ('step'), or the pair ``(state,
    outputs)`` with the state threaded through the iterations ('pure')."""

    kind: str
    call: Callable[..., Any]


def generate(
    plan: Sequence[Sequence[tuple[str, int]]],
    members: Sequence[HostMember],
    carry_src: Sequence[tuple[int, int]],
    stored: Sequence[tuple[int, int]],
    setter: int | None,
    all_true: Callable[[Any], bool],
) -> Callable[..., tuple[list[Any], list[list[Any]], int, bool]]:
    """``loop(carry0, inv, xs, states0, vals, kept)``: the body for each ``v`` of ``vals``
    (``it``-th), member ``k`` on the inputs ``plan[k]`` names (``("xs", i)``: ``xs[i][it]``;
    ``("carry", i)``, ``("inv", i)``; ``("local", k' * SLOT + oid)``: an earlier member's
    output; ``("unused", _)``: None), the carry then taken from ``carry_src``; output
    ``stored[r]`` appended to row list ``r`` where ``kept[r]`` is None or true at ``it``. A
    ``setter`` member's first input says whether the loop ends after this iteration. Returns
    the members' states, the row lists, the iterations run and whether the setter ended it."""
    used = {i for row in plan for kind, i in row if kind == "local"}
    used |= {k * SLOT + oid for k, oid in (*carry_src, *stored)}
    n_carry = len(carry_src)
    n_inv = 1 + max((i for row in plan for kind, i in row if kind == "inv"), default=-1)
    n_xs = 1 + max((i for row in plan for kind, i in row if kind == "xs"), default=-1)

    def arg(kind: str, i: int) -> str:
        if kind == "unused":
            return "None"
        if kind == "xs":
            return f"x{i}[it]"
        if kind == "local":
            return f"m{i // SLOT}_{i % SLOT}"
        return f"{kind[0]}{i}"  # carry c<i>, inv i<i>

    head = ["def loop(carry0, inv, xs, states0, vals, kept):"]
    if n_carry:
        head.append(f"    {', '.join(f'c{i}' for i in range(n_carry))}, = carry0")
    head += [f"    i{i} = inv[{i}]" for i in range(n_inv)]
    head += [f"    x{i} = xs[{i}]" for i in range(n_xs)]
    head += [f"    s{k} = states0[{k}]" for k, m in enumerate(members) if m.kind != "kernel"]
    head += [f"    r{r} = []" for r in range(len(stored))]
    head += [f"    k{r} = kept[{r}]" for r in range(len(stored))]
    head += ["    count = 0", "    done = False", "    for it, v in enumerate(vals):"]
    body: list[str] = []
    for k, (row, m) in enumerate(zip(plan, members, strict=True)):
        args = "[" + ", ".join(arg(kind, i) for kind, i in row) + "]"
        if k == setter:
            body.append(f"done = ALL({arg(*row[0])})")
        outs = sorted(i % SLOT for i in used if i // SLOT == k)
        if m.kind == "kernel":
            body.append(f"m{k}_0 = F{k}({args})" if outs else f"F{k}({args})")
            continue
        call = f"F{k}({args}, s{k}, v)"
        body.append(f"s{k}, _o = {call}" if m.kind == "pure" else f"_o = {call}")
        body += [f"m{k}_{oid} = _o[{oid}]" for oid in outs]
    if n_carry:
        body.append(
            f"{', '.join(f'c{i}' for i in range(n_carry))}, = "
            + ", ".join(f"m{k}_{o}" for k, o in carry_src)
            + ","
        )
    for r, (k, oid) in enumerate(stored):
        body.append(f"if k{r} is None or k{r}[it]:")
        body.append(f"    r{r}.append(m{k}_{oid})")
    body.append("count += 1")
    if setter is not None:
        body.append("if done:")
        body.append("    break")
    tail = [
        "    states = list(states0)",
        *(f"    states[{k}] = s{k}" for k, m in enumerate(members) if m.kind == "pure"),
        f"    return states, [{', '.join(f'r{r}' for r in range(len(stored)))}], count, done",
    ]
    src = "\n".join([*head, *("        " + line for line in body), *tail]) + "\n"
    log.debug("host loop:\n%s", src)
    scope: dict[str, Any] = {"ALL": all_true, **{f"F{k}": m.call for k, m in enumerate(members)}}
    exec(compile(src, "<timerl host loop>", "exec"), scope)  # noqa: S102 - our own generated source
    fn = scope["loop"]
    fn.source = src
    return fn

"""Tune one contraction with a trained LoopTune policy: the schedule, its loop nest, its
TIR and its measured GFLOPS.

Python::

    from timerl.looptune import tune
    res = tune("mk,kn->mn", shape=(128, 256, 64), policy="runs/ppo_looptune")
    print(res.listing, res.tir, res.gflops, res.speedup)
    res.module["main"](a, b, c)           # the compiled TVM function (tvm tensors)

CLI::

    python -m timerl.looptune.tune --policy runs/ppo_looptune "mk,kn->mn" --shape 128,256,64

``shape`` gives the size of each index letter in the order the letters first appear in
the einsum (``"mk,kn->mn"``: ``m, k, n``), or a mapping ``{"m": 128, ...}``. Any
contraction of two row-major float32 operands works: a matmul (``"ik,kj->ij"``) or
batched matmul (``"bmk,bkn->bmn"``) maps to the built-in kernels (:mod:`timerl.envs.looptune.kernels`),
any other (transposed operands or output, several reduction indices) becomes a kernel of
its own, lowered the same way (its strides and features come from its index
expressions). What LoopTune cannot express (more than two operands, no reduction index,
repeated output indices) gets a :class:`~timerl.errors.TimeRLError` naming it. For
convolutions (affine indices such as ``X[i+r, c]``) build a :class:`Problem` with a
kernel of :mod:`timerl.envs.looptune.kernels` and pass it instead of an einsum.

The policy plays a greedy episode (``steps`` actions) from the untuned nest; the best
schedule of the episode is kept (as the policy was trained: ``reward="log"``/``"best"``).
Every schedule of the episode is measured by a TVM measurer; the kept one and the
untuned nest are then measured again by ``remeasure`` fresh measurers (no cache), and
those are the reported GFLOPS.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from timerl.envs.looptune.ir import ACTIONS, LoopState, Problem, describe, initial_state
from timerl.envs.looptune.kernels import BMM, MM, parse_kernel
from timerl.envs.looptune.measure import Measurer, gflops_all
from timerl.errors import TimeRLError
from timerl.looptune.policy import Policy

log = logging.getLogger("timerl.looptune")

__all__ = ["TuneResult", "main", "parse_einsum", "tune"]


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` found (GFLOPS are the best of fresh measurements)."""

    problem: Problem
    state: LoopState  # the schedule kept
    actions: tuple[str, ...]  # the policy's actions, in order
    listing: str  # the loop nest, as text
    tir: str  # the TVMScript of the schedule
    module: Any  # the compiled TVM runtime module (function "main(A, B, C)"), None with a test measurer
    gflops: float
    untuned_gflops: float
    seconds: float  # policy inference plus compiling and timing the episode's schedules

    @property
    def speedup(self) -> float:
        """GFLOPS over the untuned nest's."""
        return self.gflops / self.untuned_gflops if self.untuned_gflops > 0 else float("nan")


def parse_einsum(spec: str, shape: Sequence[int] | Mapping[str, int]) -> Problem:
    """The :class:`Problem` of ``spec`` (``"mk,kn->mn"``) and ``shape`` (see the module doc)."""
    text = spec.replace(" ", "")
    if "->" not in text:
        raise TimeRLError(f"einsum {spec!r}: give the output explicitly, e.g. 'mk,kn->mn'")
    lhs, out = text.split("->")
    ops = lhs.split(",")
    letters: list[str] = []
    for c in text:
        if c.isalpha() and c.islower() and c not in letters:
            letters.append(c)
        elif not ((c.isalpha() and c.islower()) or c in ",->"):
            raise TimeRLError(
                f"einsum {spec!r}: unsupported character {c!r} (use lowercase letters, ',' and '->')"
            )
    if len(ops) != 2:
        raise TimeRLError(f"einsum {spec!r}: {len(ops)} operands; LoopTune tunes contractions of 2 operands")
    if not all(ops) or not out:
        raise TimeRLError(f"einsum {spec!r}: scalar operands or outputs are not supported")
    if isinstance(shape, Mapping):
        missing = [c for c in letters if c not in shape]
        if missing:
            raise TimeRLError(f"einsum {spec!r}: shape has no size for {missing}")
        sizes = {c: int(shape[c]) for c in letters}
    else:
        if len(shape) != len(letters):
            raise TimeRLError(
                f"einsum {spec!r}: shape {tuple(shape)} needs {len(letters)} sizes, one per index in the "
                f"order {','.join(letters)}"
            )
        sizes = {c: int(s) for c, s in zip(letters, shape, strict=True)}
    for builtin in (MM, BMM):  # the same contraction up to the names of the indices
        names = [d for acc in (builtin.lhs, builtin.rhs, builtin.out) for d in acc.dims]
        used = [*ops[0], *ops[1], *out]
        if len(names) == len(used):
            rename = dict(zip(names, used, strict=True))
            if len(set(rename.values())) == len(rename) and all(
                rename[a] == b for a, b in zip(names, used, strict=True)
            ):
                return Problem(*(sizes[rename[d]] for d in builtin.dims), kernel=builtin)
    kern = parse_kernel("einsum", f"A[{','.join(ops[0])}] * B[{','.join(ops[1])}] -> C[{','.join(out)}]")
    return Problem(*(sizes[d] for d in kern.dims), kernel=kern)


def tune(
    problem_or_einsum: Problem | str,
    policy: Policy | str | os.PathLike[str],
    *,
    shape: Sequence[int] | Mapping[str, int] | None = None,
    steps: int = 10,
    measurer: Measurer | None = None,
    remeasure: int = 3,
) -> TuneResult:
    """Tune a matmul with ``policy`` (a :class:`Policy` or a checkpoint path, see
    :meth:`Policy.load`); see the module doc. ``measurer`` defaults to a TVM measurer
    without disk cache (pass the analytic model in tests only)."""
    if isinstance(problem_or_einsum, str):
        if shape is None:
            raise TimeRLError(
                f"tune({problem_or_einsum!r}): an einsum needs shape=(...) with one size per index"
            )
        problem = parse_einsum(problem_or_einsum, shape)
    elif isinstance(problem_or_einsum, Problem):
        problem = problem_or_einsum
    else:
        raise TimeRLError(
            f"tune: expected a Problem or an einsum string, got {type(problem_or_einsum).__name__}"
        )
    if steps < 1 or remeasure < 1:
        raise TimeRLError(f"tune: steps and remeasure must be >= 1, got {steps}, {remeasure}")
    pol = policy if isinstance(policy, Policy) else Policy.load(policy)
    real = measurer is None
    if measurer is None:
        from timerl.envs.looptune.measure import TVMMeasurer

        measurer = TVMMeasurer(disk_cache=False)
    t0 = time.perf_counter()
    states, taken = pol.rollout(initial_state(problem), steps)
    values = gflops_all(measurer, states)  # each new schedule built once, all in one module
    seconds = time.perf_counter() - t0
    best = max(range(len(states)), key=lambda k: values[k])
    kept = states[best]
    if real:
        from timerl.envs.looptune.measure import TVMMeasurer

        def fresh(s: LoopState) -> float:
            return max(TVMMeasurer(disk_cache=False).gflops(s) for _ in range(remeasure))
    else:
        fresh = measurer.gflops
    gf, base = fresh(kept), fresh(states[0])
    from timerl.envs.looptune import tvm_lower

    module = None
    if real:
        module = tvm_lower.build(kept, tvm_lower.host_target())
    actions = tuple(ACTIONS[a] for a in taken)
    log.info("tuned %s in %.1f s: %.1f GFLOPS (untuned %.1f)", problem.name, seconds, gf, base)
    return TuneResult(
        problem, kept, actions, describe(kept), tvm_lower.script(kept), module, gf, base, seconds
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (see the module doc)."""
    p = argparse.ArgumentParser(
        prog="python -m timerl.looptune.tune",
        description="Tune a contraction (an einsum of two operands) with a trained LoopTune policy; "
        "print the loop nest, TIR and GFLOPS.",
    )
    p.add_argument("einsum", help="e.g. 'mk,kn->mn'")
    p.add_argument(
        "--shape", required=True, help="sizes of the indices in order of appearance, e.g. 128,256,64"
    )
    p.add_argument(
        "--policy", required=True, help="checkpoint file or folder, or a run folder (runs/ppo_looptune)"
    )
    p.add_argument("--steps", type=int, default=10, help="actions of the greedy episode (10)")
    p.add_argument("--remeasure", type=int, default=3, help="fresh measurements of the result (3)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        shape = [int(x) for x in args.shape.split(",") if x]
    except ValueError:
        print(
            f"error: --shape {args.shape!r}: expected comma-separated integers, e.g. 128,256,64",
            file=sys.stderr,
        )
        return 2
    try:
        res = tune(args.einsum, args.policy, shape=shape, steps=args.steps, remeasure=args.remeasure)
    except TimeRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.einsum} with {res.problem.name}: actions {' '.join(res.actions)}")
    print(res.listing)
    print(res.tir)
    print(
        f"{res.gflops:.1f} GFLOPS, untuned {res.untuned_gflops:.1f} ({res.speedup:.2f}x); "
        f"tuned in {res.seconds:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

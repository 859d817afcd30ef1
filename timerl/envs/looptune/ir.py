"""LoopTune's loop-tree IR: states, the 10 cursor actions, the 20 features.

A problem is a contraction (:mod:`.kernels`: matmul, batched matmul, 1-D and 2-D
convolutions) at given sizes. For matmul, ``C[m, n] = sum_k A[m, k] * B[k, n]``
(float32, row-major) is a tree of two sibling nests, as in loop_tool/LoopTune: a
**compute** nest that accumulates into a temporary ``T[m, n]`` (loops over ``m``, ``n``,
``k``; initial order ``m, k, n``: :attr:`.Kernel.order`) and a **write-back** nest that
copies ``T`` into ``C`` (loops over the output dims ``m``, ``n``). Other kernels have
more dims (``conv1d``: compute ``i, r, c, o``, write-back ``i, o``). An agent cursor sits
on one loop of the flattened list (compute loops first, then write-back)::

    for m in 64          <- cursor
      for k in 96
        for n in 80
          T[m,n] += A[m,k] * B[k,n]
    for m in 64
      for n in 80
        C[m,n] = T[m,n]

A loop iterates ``size`` times over its inner loops of the same dim, then runs ``tail``
leftover *elements* at the end (``for m in 2 r 16``: 2 x 32 elements, then 16 more).
Invariants (checked by :func:`check`):

- the loops of one dim keep their split order inside a nest (outer before inner), so
  swapping two loops of the same dim is not an action;
- only the outermost loop of a dim may have a tail. Splits are by powers of two and
  create inner loops of power-of-two size, and a split of such a loop always divides
  it, so tails are only ever created on the outermost loop;
- the extent covered by a dim's loops is the problem size.

Actions (indices into :data:`ACTIONS`); an invalid one leaves the state unchanged:

- ``up`` / ``down``: move the cursor (invalid at the first / last loop);
- ``swap_up`` / ``swap_down``: swap the cursor loop with its neighbour in the same
  nest, the cursor follows the loop (invalid across the nest boundary, at the ends,
  or between two loops of the same dim);
- ``split_f``: the cursor loop (size ``s``) becomes the outer loop (size ``s // f``,
  tail ``(s % f) * step + tail``) of a new inner loop of size ``f`` placed right
  below it; the cursor stays on the outer loop. Invalid unless ``f < s`` and the nest
  has fewer than ``max_loops`` loops in all.

Pure Python + NumPy: no TVM import here (see :mod:`timerl.envs.looptune.measure`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from timerl.envs.looptune.kernels import MM, Kernel, kernel
from timerl.errors import TimeRLError

ACTIONS: tuple[str, ...] = (
    "up",
    "down",
    "swap_up",
    "swap_down",
    "split_2",
    "split_4",
    "split_8",
    "split_16",
    "split_32",
    "split_64",
)
SPLIT_FACTORS: dict[int, int] = {
    i: int(a.split("_")[1]) for i, a in enumerate(ACTIONS) if a.startswith("split")
}
MAX_LOOPS = 16  # default cap on the number of loops of a state (and rows of :func:`features`)
NUM_FEATURES = 20
NUM_STRIDE_BINS = 16
SIZE_SCALE = 8.0  # features: log2(size) / 8, so sizes up to 256 map into [0, 1]


class Nest(Enum):
    """Which nest a loop belongs to."""

    COMPUTE = "c"
    WRITE = "w"


@dataclass(frozen=True, init=False)
class Problem:
    """A :class:`~.kernels.Kernel` at given sizes, one per dim in ``kernel.dims`` order:
    ``Problem(64, 80, 96)`` is the matmul ``m=64, n=80, k=96``;
    ``Problem(112, 64, 3, 32, kernel=CONV1D)`` the 1-D convolution ``i=112, o=64, r=3, c=32``."""

    kernel: Kernel
    sizes: tuple[int, ...]

    def __init__(self, *sizes: int, kernel: Kernel = MM, **named: int) -> None:
        if named:  # Problem(m=64, n=80, k=96)
            if sizes or sorted(named) != sorted(kernel.dims):
                raise TimeRLError(
                    f"{kernel.name}: give the sizes by position or as {', '.join(f'{d}=' for d in kernel.dims)}; "
                    f"got {sizes} and {named}"
                )
            sizes = tuple(named[d] for d in kernel.dims)
        sizes = tuple(int(s) for s in sizes)
        if len(sizes) != len(kernel.dims):
            raise TimeRLError(
                f"{kernel.name} ({kernel.text}) needs {len(kernel.dims)} sizes, one per dim "
                f"{','.join(kernel.dims)}; got {sizes}"
            )
        if min(sizes) < 1:
            raise TimeRLError(f"Problem sizes must be >= 1, got {dict(zip(kernel.dims, sizes, strict=True))}")
        object.__setattr__(self, "kernel", kernel)
        object.__setattr__(self, "sizes", sizes)

    def __repr__(self) -> str:
        return f"Problem({self.name})"

    @classmethod
    def from_name(cls, name: str) -> Problem:
        """The problem of :attr:`name` (``mm_64x80x96``, ``conv1d_112x64x3x32``)."""
        kname, _, sizes = name.rpartition("_")
        try:
            return cls(*(int(x) for x in sizes.split("x")), kernel=kernel(kname))
        except ValueError as exc:
            raise TimeRLError(f"cannot read problem name {name!r}: expected e.g. mm_64x80x96") from exc

    @property
    def name(self) -> str:
        return f"{self.kernel.name}_{'x'.join(str(s) for s in self.sizes)}"

    @property
    def extents(self) -> dict[str, int]:
        return dict(zip(self.kernel.dims, self.sizes, strict=True))

    @property
    def flops(self) -> int:
        return 2 * math.prod(self.sizes)

    def extent(self, dim: str) -> int:
        return self.extents[dim]


@dataclass(frozen=True)
class Loop:
    """One loop: ``size`` full iterations over its inner loops of ``dim``, then ``tail`` elements."""

    dim: str
    size: int
    tail: int
    nest: Nest

    @property
    def text(self) -> str:
        return f"{self.dim}{self.size}" + (f"r{self.tail}" if self.tail else "")


@dataclass(frozen=True)
class LoopState:
    """The loop tree (compute loops first, then write-back loops, outermost first), the
    cursor (an index into ``loops``) and the problem. Hashable; compare by value."""

    problem: Problem
    loops: tuple[Loop, ...]
    cursor: int

    @property
    def key(self) -> str:
        """Stable text key (same in every process): ``mm_64x80x96|c:m64,k96,n80|w:m64,n80|@0``."""
        c = ",".join(lp.text for lp in self.loops if lp.nest is Nest.COMPUTE)
        w = ",".join(lp.text for lp in self.loops if lp.nest is Nest.WRITE)
        return f"{self.problem.name}|c:{c}|w:{w}|@{self.cursor}"

    @property
    def schedule_key(self) -> str:
        """:attr:`key` without the cursor: states that differ only by the cursor run the same code."""
        return self.key.rsplit("|@", 1)[0]

    @property
    def num_compute(self) -> int:
        return sum(1 for lp in self.loops if lp.nest is Nest.COMPUTE)

    def nest_loops(self, nest: Nest) -> tuple[Loop, ...]:
        return tuple(lp for lp in self.loops if lp.nest is nest)


def initial_state(problem: Problem) -> LoopState:
    """The untiled nest: compute loops in :attr:`.Kernel.order` (``m, k, n``), write-back
    over the output dims (``m, n``), cursor on the first loop."""
    k, ext = problem.kernel, problem.extents
    loops = tuple(Loop(d, ext[d], 0, Nest.COMPUTE) for d in k.order)
    loops += tuple(Loop(d, ext[d], 0, Nest.WRITE) for d in k.out_dims)
    return LoopState(problem, loops, 0)


def steps(state: LoopState) -> tuple[int, ...]:
    """Elements of its dim that one iteration of each loop advances: the product of the
    sizes of the inner loops of the same dim in the same nest (they have no tails)."""
    out = []
    for i, lp in enumerate(state.loops):
        s = 1
        for inner in state.loops[i + 1 :]:
            if inner.nest is lp.nest and inner.dim == lp.dim:
                s *= inner.size
        out.append(s)
    return tuple(out)


def canonical(state: LoopState) -> LoopState:
    """``state`` with every loop merged into the loop right above it when both run over the
    same dim of the same nest (``for m in 3 r 16: for m' in 32`` is ``for m in 112``): the
    same iterations in the same order, so the same code up to loop bookkeeping. The
    measurer times this form, so splits that change nothing else share one measurement
    (no timing noise between them, and no compile). The cursor is kept on its loop or the
    merged loop that holds it."""
    st = steps(state)
    out: list[tuple[Loop, int]] = []
    cursor = 0
    for i, (lp, s) in enumerate(zip(state.loops, st, strict=True)):
        if out and out[-1][0].nest is lp.nest and out[-1][0].dim == lp.dim:
            prev, ps = out.pop()
            extent = prev.size * ps + prev.tail
            out.append((Loop(lp.dim, extent // s, extent % s, lp.nest), s))
        else:
            out.append((lp, s))
        if i == state.cursor:
            cursor = len(out) - 1
    loops = tuple(lp for lp, _ in out)
    return state if loops == state.loops else LoopState(state.problem, loops, cursor)


def check(state: LoopState) -> None:
    """Raise :class:`TimeRLError` unless ``state`` satisfies the invariants of the module doc."""
    loops, p = state.loops, state.problem
    if not 0 <= state.cursor < len(loops):
        raise TimeRLError(f"{state.key}: cursor {state.cursor} outside 0..{len(loops) - 1}")
    nests = [lp.nest for lp in loops]
    if nests != sorted(nests, key=lambda n: n is Nest.WRITE):
        raise TimeRLError(f"{state.key}: compute loops must precede write-back loops")
    st = steps(state)
    for nest, dims in ((Nest.COMPUTE, p.kernel.dims), (Nest.WRITE, p.kernel.out_dims)):
        if {lp.dim for lp in loops if lp.nest is nest} != set(dims):
            raise TimeRLError(f"{state.key}: nest {nest.name} must loop over exactly {dims}")
        for d in dims:
            idx = [i for i, lp in enumerate(loops) if lp.nest is nest and lp.dim == d]
            if any(loops[i].tail for i in idx[1:]):
                raise TimeRLError(f"{state.key}: only the outermost {d} loop may have a tail")
            first = loops[idx[0]]
            if first.size * st[idx[0]] + first.tail != p.extent(d):
                raise TimeRLError(f"{state.key}: {d} loops do not cover extent {p.extent(d)}")


def _swap_target(state: LoopState, action: str) -> int | None:
    i = state.cursor
    j = i - 1 if action == "swap_up" else i + 1
    if not 0 <= j < len(state.loops):
        return None
    a, b = state.loops[i], state.loops[j]
    if a.nest is not b.nest or a.dim == b.dim:
        return None
    return j


def is_valid(state: LoopState, action: int, max_loops: int = MAX_LOOPS) -> bool:
    """Whether ``action`` changes ``state`` (see the module doc for the rules)."""
    if not 0 <= action < len(ACTIONS):
        raise TimeRLError(f"action {action} out of range: use 0..{len(ACTIONS) - 1} ({', '.join(ACTIONS)})")
    name = ACTIONS[action]
    if name == "up":
        return state.cursor > 0
    if name == "down":
        return state.cursor < len(state.loops) - 1
    if name in ("swap_up", "swap_down"):
        return _swap_target(state, name) is not None
    f = SPLIT_FACTORS[action]
    return f < state.loops[state.cursor].size and len(state.loops) < max_loops


def apply_action(state: LoopState, action: int, max_loops: int = MAX_LOOPS) -> LoopState:
    """The state after ``action``; an invalid action returns ``state`` itself (a no-op)."""
    if not is_valid(state, action, max_loops):
        return state
    name, i = ACTIONS[action], state.cursor
    if name == "up":
        return replace(state, cursor=i - 1)
    if name == "down":
        return replace(state, cursor=i + 1)
    loops = list(state.loops)
    if name in ("swap_up", "swap_down"):
        j = _swap_target(state, name)
        assert j is not None
        loops[i], loops[j] = loops[j], loops[i]
        return replace(state, loops=tuple(loops), cursor=j)
    f = SPLIT_FACTORS[action]
    lp, step = loops[i], steps(state)[i]
    outer = replace(lp, size=lp.size // f, tail=(lp.size % f) * step + lp.tail)
    loops[i : i + 1] = [outer, Loop(lp.dim, f, 0, lp.nest)]
    return replace(state, loops=tuple(loops))


def stride_bin(stride: int) -> int:
    """Histogram bin of a positive stride: ``floor(log2(stride))`` clipped to 0..15."""
    return min(NUM_STRIDE_BINS - 1, int(math.floor(math.log2(stride))))


def access_strides(state: LoopState) -> list[list[int]]:
    """Per loop, the element strides of the accesses its iterator moves (a tensor that
    does not depend on the loop's dim is not listed: it is reused, stride 0).

    The strides come from the kernel's index expressions (:meth:`.Access.stride`): the
    compute body reads ``lhs`` and ``rhs`` and updates the accumulator ``T`` (indexed as
    the output), the write-back body reads ``T`` and writes the output; all row-major.
    For matmul, ``A[m,k]``, ``B[k,n]``, ``T[m,n]`` and ``T[m,n]``, ``C[m,n]``; for
    ``X[i+r,c]`` both ``i`` and ``r`` move ``X`` by ``C`` elements. The stride of a loop
    is its :func:`steps` times the access's stride along its dim.
    """
    k, ext = state.problem.kernel, state.problem.extents
    accesses = {Nest.COMPUTE: k.accesses, Nest.WRITE: (k.out, k.out)}
    out = []
    for lp, st in zip(state.loops, steps(state), strict=True):
        strides = (acc.stride(lp.dim, ext) for acc in accesses[lp.nest])
        out.append([st * s for s in strides if s])
    return out


def features(state: LoopState, max_loops: int = MAX_LOOPS) -> np.ndarray:
    """The ``(max_loops, 20)`` float32 observation, one row per loop (outermost compute
    loop first, then the write-back loops), zero rows after the last loop.

    Columns: ``0`` cursor on this loop (0/1); ``1`` ``log2(size) / 8``; ``2``
    ``log2(1 + tail) / 8``; ``3`` compute nest (1) or write-back (0); ``4..19`` stride
    histogram: column ``4 + b`` counts the body accesses (see :func:`access_strides`)
    whose stride falls in bin ``b`` (``2^b <= stride < 2^(b+1)``, last bin open), divided
    by 3 (the most accesses of a body) so entries lie in [0, 1]. Sizes and tails tell how
    often each stride occurs, as in the paper.
    """
    if len(state.loops) > max_loops:
        raise TimeRLError(
            f"{state.key} has {len(state.loops)} loops, more than max_loops={max_loops}: "
            "raise max_loops (features and the env's observation size)"
        )
    out = np.zeros((max_loops, NUM_FEATURES), np.float32)
    for r, (lp, strides) in enumerate(zip(state.loops, access_strides(state), strict=True)):
        out[r, 0] = float(r == state.cursor)
        out[r, 1] = math.log2(lp.size) / SIZE_SCALE
        out[r, 2] = math.log2(1 + lp.tail) / SIZE_SCALE
        out[r, 3] = float(lp.nest is Nest.COMPUTE)
        for s in strides:
            out[r, 4 + stride_bin(s)] += 1.0 / 3.0
    return out


def loop_names(state: LoopState) -> tuple[str, ...]:
    """Iterator names: ``m``, ``m'``, ``m''``, ... for the split levels of a dim in a nest."""
    seen: dict[tuple[Nest, str], int] = {}
    names = []
    for lp in state.loops:
        n = seen.get((lp.nest, lp.dim), 0)
        seen[(lp.nest, lp.dim)] = n + 1
        names.append(lp.dim + "'" * n)
    return tuple(names)


def describe(state: LoopState) -> str:
    """A readable nest (one line per loop, the cursor marked), for logs."""
    lines = [f"# {state.problem.name}"]
    names = loop_names(state)
    depth = 0
    k = state.problem.kernel
    acc = k.out.text(name="T")
    for i, (lp, name) in enumerate(zip(state.loops, names, strict=True)):
        if i == state.num_compute:
            lines.append("  " * depth + f"{acc} += {k.lhs.text()} * {k.rhs.text()}")
            depth = 0
        tail = f" r {lp.tail}" if lp.tail else ""
        mark = "    <- cursor" if i == state.cursor else ""
        lines.append("  " * depth + f"for {name} in {lp.size}{tail}{mark}")
        depth += 1
    lines.append("  " * depth + f"{k.out.text()} = {acc}")
    return "\n".join(lines)

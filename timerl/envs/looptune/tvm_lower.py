"""Lower a :class:`~timerl.envs.looptune.ir.LoopState` to TVM TIR and build it with LLVM.

The only module of the package that imports ``tvm`` (lazily: ``import tvm`` costs 1-7 s).
TVM 0.27 names: ``tvm.s_tir.Schedule``, ``get_sblock``, JSON-dict targets, ``tvm.compile``.

The function computes ``T = A @ B`` (a reduction block, the compute nest) and then
``C = T`` (the write-back block). Per nest and per dim, the IR's loops become one TVM
``split`` of the dim's axis with factors ``[None, s_2, ..., s_r]`` (the sizes of the inner
loops); the outer factor is ``ceil(extent / step)``, so a tail becomes one last partial
iteration guarded by a predicate (only the outermost loop of a dim has a tail, see
:mod:`.ir`). Then ``reorder`` puts the loops in the IR's order, and, as LoopNest does,
the innermost loop is vectorized when it runs over ``n`` (unit stride in ``B``, ``T``
and ``C``) and is at most ``max_lanes`` wide; wider loops are left to LLVM's own
vectorizer. An innermost ``m`` loop is not vectorized: 64-lane gathers and scatters cost
LLVM 1-3 s per state and run no faster. Explicit unrolling
(TVM's ``pragma_auto_unroll_max_step``) is off by default and capped at
:data:`MAX_UNROLL_STEP`: full unrolls of big loops cost seconds of LLVM time, and LLVM's
own unroller (which has its own size cap) did as well in our measurements. The reduction
init (``T = 0``) is hoisted before the whole compute nest. No loop is parallel, so every
kernel runs single-threaded whatever ``TVM_NUM_THREADS`` says.
"""

from __future__ import annotations

import os
from typing import Any

from timerl.envs.looptune.ir import Dim, LoopState, Nest, check
from timerl.errors import TimeRLError

MAX_UNROLL_STEP = 64
LOWERING_VERSION = 2  # bump when the generated code changes (it keys the disk cache)


def import_tvm() -> Any:
    """``tvm``, imported on first use with ``TVM_NUM_THREADS=1`` unless already set."""
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    try:
        import tvm
        import tvm.s_tir  # noqa: F401
        from tvm import te  # noqa: F401
    except ImportError as exc:
        raise TimeRLError(
            "the LoopTune TVM measurer needs apache-tvm: pip install 'timerl[looptune]' "
            f"(apache-tvm==0.27.0.post1, apache-tvm-ffi==0.1.14.post1); import failed: {exc}"
        ) from exc
    return tvm


def host_cpu() -> str:
    """LLVM's name for this CPU (e.g. ``znver4``)."""
    return str(import_tvm().target.codegen.llvm_get_system_cpu())


def host_target() -> Any:
    """An LLVM target for this CPU, one core."""
    tvm = import_tvm()
    return tvm.target.Target({"kind": "llvm", "mcpu": host_cpu(), "num-cores": 1})


def lower(state: LoopState, max_lanes: int = 64, unroll_max_step: int = 0) -> Any:
    """The TIR ``IRModule`` (function ``main(A, B, C)``) of ``state``'s schedule."""
    if not 0 <= unroll_max_step <= MAX_UNROLL_STEP:
        raise TimeRLError(
            f"unroll_max_step={unroll_max_step} is outside 0..{MAX_UNROLL_STEP}: large unrolls make "
            "LLVM take seconds per state; use a smaller value (0 leaves unrolling to LLVM)"
        )
    check(state)
    tvm = import_tvm()
    from tvm import te

    p = state.problem
    a = te.placeholder((p.m, p.k), "float32", name="A")
    b = te.placeholder((p.k, p.n), "float32", name="B")
    r = te.reduce_axis((0, p.k), name="k")
    t = te.compute((p.m, p.n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="T")
    c = te.compute((p.m, p.n), lambda i, j: t[i, j], name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, b, c]))
    for nest, block_name, dims in (
        (Nest.COMPUTE, "T", (Dim.M, Dim.N, Dim.K)),
        (Nest.WRITE, "C", (Dim.M, Dim.N)),
    ):
        block = sch.get_sblock(block_name)
        axes = dict(zip(dims, sch.get_loops(block), strict=True))
        loops = state.nest_loops(nest)
        per_dim: dict[Dim, list[Any]] = {}
        for d, axis in axes.items():
            sizes = [lp.size for lp in loops if lp.dim is d]
            per_dim[d] = list(sch.split(axis, factors=[None, *sizes[1:]])) if len(sizes) > 1 else [axis]
        order = [per_dim[lp.dim].pop(0) for lp in loops]
        sch.reorder(*order)
        inner = loops[-1]
        lanes = inner.size + (1 if inner.tail else 0)
        if inner.dim is Dim.N and lanes <= max_lanes:
            sch.vectorize(order[-1])
        if unroll_max_step:
            sch.annotate(order[0], "pragma_auto_unroll_max_step", unroll_max_step)
            sch.annotate(order[0], "pragma_unroll_explicit", 1)
        if nest is Nest.COMPUTE:
            # After vectorize: the update block without its init fails vectorize's checks.
            init = sch.decompose_reduction(block, order[0])
            _simplify_init(sch, init, [lp.dim for lp in loops if lp.dim is not Dim.K])
    return sch.mod


def _simplify_init(sch: Any, init: Any, dims: list[Dim]) -> None:
    """Turn the init nest (a copy of the compute nest's spatial loops, split and with the
    tail predicate) into one ``m`` loop around one ``n`` loop. Left as a copy, a
    predicate over three or more split loops made LLVM's JIT take 2+ s for one state."""
    loops = sch.get_loops(init)
    ms = [lp for lp, d in zip(loops, dims, strict=True) if d is Dim.M]
    ns = [lp for lp, d in zip(loops, dims, strict=True) if d is Dim.N]
    sch.reorder(*ms, *ns)
    for group in (ms, ns):
        if len(group) > 1:
            sch.fuse(*group)


def build(state: LoopState, target: Any, max_lanes: int = 64, unroll_max_step: int = 0) -> Any:
    """Compile ``state`` for ``target``: a runtime module with function ``main(A, B, C)``."""
    tvm = import_tvm()
    return tvm.compile(lower(state, max_lanes, unroll_max_step), target=target)

"""The TVM template of a layer: a TIR schedule from a configuration of its knob space.

The compute is written with ``te`` (conv2d on the padded input, or matmul) and scheduled
with ``tvm.s_tir.Schedule`` (TVM 0.27's names; ``tvm`` is imported through
:func:`timerl.envs.looptune.tvm_lower.import_tvm`, single-threaded). For a configuration:

1. every loop ``l`` is split into ``l_0`` (outer) and ``l_1`` (inner, the tile knob);
2. loops are ordered ``outer output loops, outer reduction loops, inner reduction loops,
   inner output loops`` (for conv2d ``f_0 y_0 x_0 rc_0 ry_0 rx_0 rc_1 ry_1 rx_1 f_1 y_1 x_1``);
3. the output block is accumulated in a local buffer written back under the last outer
   output loop (the register tile, ``cache_write`` + ``reverse_compute_at``) and its
   initialisation is hoisted out of the reduction (``decompose_reduction``);
4. ``vectorize``: the innermost output loop is vectorised (a no-op when its tile is 1);
   ``parallel``: the outermost loop is parallel; ``auto_unroll_max_step`` and
   ``unroll_explicit`` annotate the outermost loop (``pragma_auto_unroll_max_step``,
   ``pragma_unroll_explicit``), as AutoTVM's templates do.

The function built is ``main(A, B, C)`` with the shapes of :meth:`.Layer.input_shapes`.

With ``unroll_explicit = 0`` TVM leaves the unrolling to LLVM with a loop hint that its
LLVM backend ignores, and says so on the native stderr once per build ("Unroll hint get
ignore"): :func:`build` silences the native stderr while compiling (errors still reach
the caller as Python exceptions, with their messages).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from timerl.envs.looptune.tvm_lower import import_tvm
from timerl.envs.release.space import Config, KnobSpace, Layer, LayerKind


def compute(layer: Layer) -> Any:
    """The unscheduled TIR ``PrimFunc`` of ``layer``."""
    tvm = import_tvm()
    te = tvm.te
    sa, sb, sc = layer.input_shapes()
    a = te.placeholder(sa, name="A")
    b = te.placeholder(sb, name="B")
    if layer.kind is LayerKind.MATMUL:
        k = te.reduce_axis((0, layer.sizes[2]), "k")
        c = te.compute(sc, lambda i, j: te.sum(a[i, k] * b[k, j], axis=[k]), name="out")
    else:
        c_in, _, _, kh, s, _ = layer.sizes
        rc = te.reduce_axis((0, c_in), "rc")
        ry = te.reduce_axis((0, kh), "ry")
        rx = te.reduce_axis((0, kh), "rx")
        c = te.compute(
            sc,
            lambda f, y, x: te.sum(a[rc, y * s + ry, x * s + rx] * b[f, rc, ry, rx], axis=[rc, ry, rx]),
            name="out",
        )
    return te.create_prim_func([a, b, c])


def schedule(space: KnobSpace, cfg: Config) -> Any:
    """The scheduled ``IRModule`` of configuration ``cfg`` (see the module doc)."""
    tvm = import_tvm()
    layer = space.layer
    vals = space.values(cfg)
    sch = tvm.s_tir.Schedule(compute(layer))
    blk = sch.get_sblock("out")
    loops = sch.get_loops(blk)
    outer, inner = [], []
    for (name, _), lp in zip(layer.loops, loops, strict=True):
        o, i = sch.split(lp, [None, vals[f"tile_{name}"]])
        outer.append(o)
        inner.append(i)
    ns = layer.num_spatial
    sch.reorder(*outer[:ns], *outer[ns:], *inner[ns:], *inner[:ns])
    cache = sch.cache_write(blk, 0, "global")
    sch.reverse_compute_at(cache, outer[ns - 1])
    if vals["vectorize"] and vals[f"tile_{layer.loops[ns - 1][0]}"] > 1:
        sch.vectorize(inner[ns - 1])
    if vals["parallel"]:
        sch.parallel(outer[0])
    if vals["auto_unroll_max_step"]:
        sch.annotate(outer[0], "pragma_auto_unroll_max_step", vals["auto_unroll_max_step"])
        sch.annotate(outer[0], "pragma_unroll_explicit", vals["unroll_explicit"])
    sch.decompose_reduction(blk, outer[ns])
    return sch.mod


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null inside the block (TVM's C++ warnings)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def build(space: KnobSpace, cfg: Config, target: Any) -> Any:
    """Compile ``cfg`` for ``target`` and JIT it: a module with function ``main(A, B, C)``."""
    tvm = import_tvm()
    mod = schedule(space, cfg)
    with _quiet_native_stderr():
        lib = tvm.compile(mod, target=target).jit()
        lib["main"]  # LLVM's code generation (and its warnings) happens at the first lookup
    return lib

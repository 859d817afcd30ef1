"""Lower a :class:`~timerl.envs.looptune.ir.LoopState` to TVM TIR and build it with LLVM.

The only module of the package that imports ``tvm`` (lazily: ``import tvm`` costs 1-7 s).
TVM 0.27 names: ``tvm.script`` with the ``tirx`` dialect, JSON-dict targets, ``tvm.compile``.

The function ``main(A, B, C)`` takes the kernel's ``lhs``, ``rhs`` and output
(:mod:`.kernels`; for matmul ``T = A @ B``): it zeroes an accumulator ``T`` shaped like
the output, runs the compute nest, then copies ``T`` into ``C`` (the write-back nest).
Index expressions come from the kernel (``X[i+r, c]`` reads ``A[i0*8 + i1 + r0, c0]``). Each nest is written out loop by loop, as LoopNest runs
it: a loop ``for n in 3 r 16`` over a region of its dim runs ``3`` full iterations of
its inner loops (a **main loop**), then the ``16`` leftover elements once through a
copy of the inner loops restricted to them (the **remainder**), where the next loop of
the same dim (``for n' in 32``) covers only 16 elements (``for n' in 16``). No loop
body holds a bounds guard, so the innermost loop is vectorized in the main part and in
the remainder alike::

    for n in 3:               # main loop
      for k in 240:
        for n' in vectorized(32): T[m, n*32 + n'] += A[m, k] * B[k, n*32 + n']
    for k in 240:             # remainder (n = 96..111)
      for n' in vectorized(16): T[m, n' + 96] += A[m, k] * B[k, n' + 96]

Loops of one iteration are not emitted (their offset is a constant). As LoopNest does,
an innermost loop over the kernel's :attr:`~.Kernel.vector_dim` (the output's last dim:
unit stride in ``T`` and ``C``; ``n`` for matmul) at most ``max_lanes`` wide is
vectorized; wider ones are left to LLVM's own vectorizer. An innermost loop over another
dim (``m`` or ``k``) is not vectorized: 64-lane gathers and scatters cost LLVM
1-3 s per state and run no faster. Explicit unrolling (``pragma_auto_unroll_max_step``
on the outermost loop of each nest) is off by default and capped at
:data:`MAX_UNROLL_STEP`: full unrolls of big loops cost seconds of LLVM time, and LLVM's
own unroller did as well in our measurements. No loop is parallel, so every kernel runs
single-threaded whatever ``TVM_NUM_THREADS`` says.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from timerl.envs.looptune.ir import Loop, LoopState, Nest, check, steps
from timerl.envs.looptune.kernels import Access
from timerl.errors import TimeRLError

MAX_UNROLL_STEP = 64
LOWERING_VERSION = 4  # bump when the generated code changes (it keys the disk cache)


def import_tvm() -> Any:
    """``tvm``, imported on first use with ``TVM_NUM_THREADS=1`` unless already set."""
    os.environ.setdefault("TVM_NUM_THREADS", "1")
    try:
        import tvm
        import tvm.s_tir  # noqa: F401
        import tvm.script  # noqa: F401
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


@dataclass(frozen=True)
class _Region:
    """The elements of one dim that the loops still to emit cover: from ``terms + const``
    (loop variables times their steps, and a constant), ``extent`` elements."""

    terms: tuple[str, ...]
    const: int
    extent: int

    @property
    def offset(self) -> str:
        """The first element as a TVMScript expression."""
        parts = [*self.terms, str(self.const)] if self.const or not self.terms else list(self.terms)
        return " + ".join(parts)

    def at(self, term: str | None, const: int, extent: int) -> _Region:
        """The sub-region ``term + const`` further on, ``extent`` wide."""
        terms = (*self.terms, term) if term else self.terms
        return _Region(terms, self.const + const, extent)


class _Emitter:
    """Writes one nest as TVMScript lines (see the module doc)."""

    def __init__(
        self,
        loops: tuple[Loop, ...],
        steps_: tuple[int, ...],
        body: Callable[[dict[str, str]], str],
        vector_dim: str,
        max_lanes: int,
        unroll: int,
    ):
        self.loops, self.steps, self.body = loops, steps_, body
        self.vector_dim, self.max_lanes, self.unroll = vector_dim, max_lanes, unroll
        self.lines: list[str] = []
        self.names: list[str] = []
        seen: dict[str, int] = {}
        for lp in loops:
            seen[lp.dim] = seen.get(lp.dim, -1) + 1
            self.names.append(f"{lp.dim}{seen[lp.dim]}")

    def emit(self, i: int, regions: dict[str, _Region], depth: int) -> None:
        """Loops ``i..`` (and the body) over ``regions``, indented ``depth`` levels."""
        pad = "    " * depth
        if i == len(self.loops):
            self.lines.append(pad + self.body({d: r.offset for d, r in regions.items()}))
            return
        lp, step = self.loops[i], self.steps[i]
        reg = regions[lp.dim]
        full, rem = divmod(reg.extent, step)
        innermost_n = i == len(self.loops) - 1 and lp.dim == self.vector_dim
        if innermost_n and 1 < full <= self.max_lanes and full & (full - 1):
            # TVM's vectors of 48 or 112 lanes run 3-5x slower than LLVM's own loop:
            # vectorize the power-of-two pieces (48 = 32 + 16) one after the other.
            start = 0
            for bit in reversed(range(full.bit_length())):
                lanes = 1 << bit
                if full & lanes:
                    if lanes == 1:
                        self.emit(i + 1, {**regions, lp.dim: reg.at(None, start, 1)}, depth)
                    else:
                        self._loop(i, regions, depth, start, f"T.vectorized({lanes})")
                    start += lanes
            return
        if full == 1:
            self.emit(i + 1, {**regions, lp.dim: reg.at(None, 0, step)}, depth)
        elif full > 1:
            if innermost_n and full <= self.max_lanes:
                rng = f"T.vectorized({full})"
            elif i == 0 and self.unroll:
                ann = f'{{"pragma_auto_unroll_max_step": {self.unroll}, "pragma_unroll_explicit": 1}}'
                rng = f"T.serial({full}, annotations={ann})"
            else:
                rng = f"range({full})"
            self._loop(i, regions, depth, 0, rng)
        if rem:
            self.emit(i + 1, {**regions, lp.dim: reg.at(None, full * step, rem)}, depth)

    def _loop(self, i: int, regions: dict[str, _Region], depth: int, start: int, rng: str) -> None:
        """``for var in rng`` (loop ``i``, from ``start`` elements into its region) and its body."""
        lp, step, var = self.loops[i], self.steps[i], self.names[i]
        self.lines.append("    " * depth + f"for {var} in {rng}:")
        term = var if step == 1 else f"{var} * {step}"
        self.emit(i + 1, {**regions, lp.dim: regions[lp.dim].at(term, start, step)}, depth + 1)


def script(state: LoopState, max_lanes: int = 64, unroll_max_step: int = 0) -> str:
    """The TVMScript text of ``state``'s function ``main(A, B, C)`` (see the module doc)."""
    if not 0 <= unroll_max_step <= MAX_UNROLL_STEP:
        raise TimeRLError(
            f"unroll_max_step={unroll_max_step} is outside 0..{MAX_UNROLL_STEP}: large unrolls make "
            "LLVM take seconds per state; use a smaller value (0 leaves unrolling to LLVM)"
        )
    check(state)
    p = state.problem
    k, ext = p.kernel, p.extents
    st = steps(state)

    def shape(acc: Access) -> str:
        return "(" + ", ".join(str(n) for n in acc.shape(ext)) + ",)"

    out_shape = shape(k.out)
    zs = [f"z{a}" for a in range(len(k.out.axes))]
    lines = [
        "@T.prim_func",
        f'def main(A: T.Buffer({shape(k.lhs)}, "float32"), B: T.Buffer({shape(k.rhs)}, "float32"), '
        f'C: T.Buffer({out_shape}, "float32")):',
        '    T.func_attr({"tirx.noalias": True, "global_symbol": "main"})',
        f'    Tt = T.decl_buffer({out_shape}, "float32")',
        f"    for {', '.join(zs)} in T.grid{out_shape}:",
        f"        Tt[{', '.join(zs)}] = T.float32(0.0)",
    ]

    def compute(idx: dict[str, str]) -> str:
        acc = k.out.text(idx, "Tt")
        return f"{acc} = {acc} + {k.lhs.text(idx, 'A')} * {k.rhs.text(idx, 'B')}"

    def write(idx: dict[str, str]) -> str:
        return f"{k.out.text(idx, 'C')} = {k.out.text(idx, 'Tt')}"

    bodies = {Nest.COMPUTE: compute, Nest.WRITE: write}
    for nest in (Nest.COMPUTE, Nest.WRITE):
        idx = [i for i, lp in enumerate(state.loops) if lp.nest is nest]
        loops = tuple(state.loops[i] for i in idx)
        em = _Emitter(
            loops, tuple(st[i] for i in idx), bodies[nest], k.vector_dim, max_lanes, unroll_max_step
        )
        regions = {lp.dim: _Region((), 0, p.extent(lp.dim)) for lp in loops}
        em.emit(0, regions, 1)
        lines.extend(em.lines)
    return "\n".join(lines) + "\n"


def lower(state: LoopState, max_lanes: int = 64, unroll_max_step: int = 0) -> Any:
    """The TIR ``IRModule`` (function ``main(A, B, C)``) of ``state``'s schedule: its
    :func:`script`, made by :func:`from_script` (the function TVM's parser makes of it)."""
    tvm = import_tvm()
    return tvm.IRModule({"main": from_script(script(state, max_lanes, unroll_max_step))})


def parse_script(text: str) -> Any:
    """The ``PrimFunc`` of a :func:`script` text, by TVM's TVMScript parser (8-11 ms a
    state; :func:`from_script` makes the same function in about 1 ms)."""
    tvm = import_tvm()
    from tvm.script import tirx

    return tvm.script.from_source(text, extra_vars={"T": tirx})


_SIGNATURE = re.compile(r"def main\((.*)\):$")
_ARG = re.compile(r'(\w+): (T\.Buffer\(\([^)]*\), "float32"\))')
_FOR = re.compile(r"for (.+) in (.+):$")


def from_script(text: str) -> Any:
    """The ``PrimFunc`` of a :func:`script` text, made with TVM's IR builder as TVM's
    parser makes it (:func:`parse_script`; the tests check both give structurally equal
    functions that print the same), without its Python-AST machinery: about 1 ms a state
    instead of 8-11. The text has few kinds of lines (the signature, the function's
    attributes, the declaration of ``Tt``, loop headers over ``range(n)`` or a ``T.``
    loop kind, and stores ``X[...] = value``); each expression in them is evaluated as
    Python over the builder's ``T`` and the buffers and loop variables in scope."""
    import contextlib

    from tvm.script import tirx as T
    from tvm.script.ir_builder import IRBuilder
    from tvm.tirx.script.builder import ir as builder

    lines = text.splitlines()
    sig = _SIGNATURE.match(lines[1]) if lines[:1] == ["@T.prim_func"] and len(lines) > 1 else None
    if sig is None:
        raise TimeRLError(f"not a LoopTune script (see tvm_lower.script): {text[:80]!r}")
    scope: dict[str, Any] = {"T": T}
    with IRBuilder() as ib, builder.prim_func():
        T.func_name("main")
        for name, ann in _ARG.findall(sig.group(1)):
            scope[name] = T.arg(name, eval(ann, scope))
        loops: list[tuple[int, contextlib.ExitStack]] = []  # open loops: (indent, frame)
        for line in lines[2:]:
            indent = len(line) - len(line.lstrip(" "))
            stmt = line.strip()
            while loops and loops[-1][0] >= indent:
                loops.pop()[1].close()
            if stmt.startswith("T.func_attr(") and stmt.endswith(")"):
                T.func_attr(eval(stmt[len("T.func_attr(") : -1], scope))
            elif loop := _FOR.match(stmt):
                names = [v.strip() for v in loop.group(1).split(",")]
                spec = loop.group(2)
                if spec.startswith("range(") and spec.endswith(")"):
                    frame = T.serial(0, eval(spec[len("range(") : -1], scope))
                else:
                    frame = eval(spec, scope)
                stack = contextlib.ExitStack()
                bound = stack.enter_context(frame)
                for name, var in zip(names, bound if len(names) > 1 else [bound], strict=True):
                    IRBuilder.name(name, var)
                    scope[name] = var
                loops.append((indent, stack))
            else:
                target, value = stmt.split(" = ", 1)
                if "[" not in target:  # Tt = T.decl_buffer(...)
                    scope[target] = eval(value, scope)
                    IRBuilder.name(target, scope[target])
                    continue
                buf, index = target.split("[", 1)
                indices = eval(f"({index.removesuffix(']')},)", scope)
                T.buffer_store(scope[buf], eval(value, scope), list(indices))
        while loops:
            loops.pop()[1].close()
    return ib.get()


def _compile(mod: Any, target: Any, checks: bool) -> Any:
    """``tvm.compile(mod, target)``; ``checks=False`` leaves out the checks of the arguments
    (their shapes, types and devices) from the packed function that calls the kernel: the
    kernel's machine code stays the same (tested: the same assembly for rollouts and
    random schedules of every kernel), the module compiles in about 60 % of the time."""
    tvm = import_tvm()
    if checks:
        return tvm.compile(mod, target=target)
    with tvm.transform.PassContext(config={"tirx.disable_assert": True}):
        return tvm.compile(mod, target=target)


def build(
    state: LoopState, target: Any, max_lanes: int = 64, unroll_max_step: int = 0, checks: bool = True
) -> Any:
    """Compile ``state`` for ``target``: a runtime module with function ``main(A, B, C)``
    (``checks=False``: without the checks of its arguments, see :func:`_compile`; for
    measuring only, on arrays of the right shapes)."""
    return _compile(lower(state, max_lanes, unroll_max_step), target, checks)


def build_many(
    states: Sequence[LoopState],
    target: Any,
    max_lanes: int = 64,
    unroll_max_step: int = 0,
    checks: bool = True,
) -> tuple[Any, list[str]]:
    """Compile ``states`` for ``target`` into one runtime module, and the names of their
    functions (``s0``, ``s1``, ...: ``states[i]``'s ``main(A, B, C)`` as :func:`build` gives
    it). One TVM pass pipeline and one LLVM module for all: about 15 ms less per state
    than building them one by one (a rollout's 5 schedules: 0.23 s instead of 0.31 s), and
    the same machine code per function (the same GFLOPS)."""
    tvm = import_tvm()
    names = [f"s{i}" for i in range(len(states))]
    funcs = {
        name: lower(s, max_lanes, unroll_max_step)["main"].with_attr("global_symbol", name)
        for name, s in zip(names, states, strict=True)
    }
    return _compile(tvm.IRModule(funcs), target, checks), names

"""C code from a schedule: isl builds the AST of the schedule map, a small printer turns
it into C (``#pragma omp parallel for`` on parallel loops, ``#pragma GCC unroll f`` on
unrolled innermost loops), and a fixed harness initialises the arrays, runs the kernel
once to dump the output arrays, then times ``reps`` runs (arrays re-initialised before
each, not timed) and prints one time in seconds per line.
"""

from __future__ import annotations

import islpy as isl

from timerl.envs.tiramisu.program import Program, body_c
from timerl.envs.tiramisu.schedule import Schedule

__all__ = ["ast_of", "kernel_c", "program_c"]

_N = isl.ast_node_type


def ast_of(sched: Schedule) -> isl.AstNode:
    """isl's AST for the schedule (iterators ``c<k>`` name schedule dimension k)."""
    build = isl.AstBuild.from_context(isl.Set.read_from_str(sched.program.ctx, "{ : }"))
    return build.node_from_schedule_map(sched.isl_map())


def _stmts_in(node: isl.AstNode) -> set[str]:
    t = node.get_type()
    if t == _N.block:
        ch = node.block_get_children()
        out: set[str] = set()
        for k in range(ch.n_ast_node()):
            out |= _stmts_in(ch.get_at(k))
        return out
    if t == _N.for_:
        return _stmts_in(node.for_get_body())
    if t == _N.if_:
        out = _stmts_in(node.if_get_then_node())
        if node.if_has_else_node():
            out |= _stmts_in(node.if_get_else_node())
        return out
    if t == _N.user:
        return {node.user_get_expr().op_get_arg(0).id_get_id().get_name()}
    if t == _N.mark:
        return _stmts_in(node.mark_get_node())
    return set()


def _has_for(node: isl.AstNode) -> bool:
    t = node.get_type()
    if t == _N.for_:
        return True
    if t == _N.block:
        ch = node.block_get_children()
        return any(_has_for(ch.get_at(k)) for k in range(ch.n_ast_node()))
    if t == _N.if_:
        return _has_for(node.if_get_then_node()) or (
            node.if_has_else_node() and _has_for(node.if_get_else_node())
        )
    if t == _N.mark:
        return _has_for(node.mark_get_node())
    return False


class _Printer:
    def __init__(self, sched: Schedule) -> None:
        self.sched = sched
        p = sched.program
        self.par_dims: dict[str, int] = {}  # statement -> parallel schedule dim
        self.unroll: dict[str, int] = {}
        for b, names in enumerate(p.branches):
            for n in names:
                if sched.parallel[b] >= 0:
                    self.par_dims[n] = 2 * sched.parallel[b] + 1
                if sched.unroll[b] > 1:
                    self.unroll[n] = sched.unroll[b]
        self.lines: list[str] = []

    def emit(self, node: isl.AstNode, ind: int) -> None:
        pad = "  " * ind
        t = node.get_type()
        if t == _N.block:
            ch = node.block_get_children()
            for k in range(ch.n_ast_node()):
                self.emit(ch.get_at(k), ind)
        elif t == _N.for_:
            it = node.for_get_iterator().id_get_id().get_name()
            dim = int(it[1:])
            body = node.for_get_body()
            stmts = _stmts_in(body)
            parallel = any(self.par_dims.get(s) == dim for s in stmts)
            if parallel:
                self.lines.append(f"{pad}#pragma omp parallel for")
            elif not _has_for(body):  # (an unroll pragma cannot follow the omp one)
                f = max((self.unroll.get(s, 0) for s in stmts), default=0)
                if f > 1:
                    self.lines.append(f"{pad}#pragma GCC unroll {f}")
            init = node.for_get_init().to_C_str()
            cond = node.for_get_cond().to_C_str()
            inc = node.for_get_inc().to_C_str()
            self.lines.append(f"{pad}for (int {it} = {init}; {cond}; {it} += {inc}) {{")
            self.emit(body, ind + 1)
            self.lines.append(f"{pad}}}")
        elif t == _N.if_:
            self.lines.append(f"{pad}if ({node.if_get_cond().to_C_str()}) {{")
            self.emit(node.if_get_then_node(), ind + 1)
            if node.if_has_else_node():
                self.lines.append(f"{pad}}} else {{")
                self.emit(node.if_get_else_node(), ind + 1)
            self.lines.append(f"{pad}}}")
        elif t == _N.user:
            e = node.user_get_expr()
            name = e.op_get_arg(0).id_get_id().get_name()
            args = [e.op_get_arg(k).to_C_str() for k in range(1, e.op_get_n_arg())]
            self.lines.append(f"{pad}{name}({', '.join(args)});")
        elif t == _N.mark:
            self.emit(node.mark_get_node(), ind)
        else:  # pragma: no cover - isl emits no other node kinds for these schedules
            raise AssertionError(f"unexpected isl AST node {t}")


def kernel_c(sched: Schedule) -> str:
    """The body of ``kernel()`` for the schedule."""
    pr = _Printer(sched)
    pr.emit(ast_of(sched), 1)
    return "\n".join(pr.lines)


_HEADER = """#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))
#define min(a, b) ((a) < (b) ? (a) : (b))
#define max(a, b) ((a) > (b) ? (a) : (b))
"""


def program_c(sched: Schedule, baseline: Schedule | None = None, clock: str = "CLOCK_MONOTONIC") -> str:
    """A complete C program: ``./prog OUT_FILE REPS`` dumps the output arrays after one
    run of ``sched``'s kernel to OUT_FILE (float32, in the order of ``program.arrays``),
    then prints REPS kernel times in seconds, one per line. With ``baseline``, each line
    holds two times, ``baseline`` then ``sched``, alternating in the same process (both
    under the same machine load). ``clock``: the ``clock_gettime`` clock of the timings
    (``CLOCK_PROCESS_CPUTIME_ID``: CPU time, which a serial kernel does not accrue while
    it waits for a core on a loaded machine)."""
    p: Program = sched.program
    if clock not in ("CLOCK_MONOTONIC", "CLOCK_PROCESS_CPUTIME_ID"):
        raise ValueError(f"unsupported clock {clock!r}")
    out = [_HEADER]
    for a in p.arrays:
        out.append(f"float {a.name}{''.join(f'[{n}]' for n in a.shape)};")
    for s in p.statements:
        args = [f"_{it}" for it in s.iterators]
        out.append(f"#define {s.name}({', '.join(args)}) {body_c(s, args)}")
    out.append("static void init(void) {")
    for k, a in enumerate(p.arrays):
        n = 1
        for d in a.shape:
            n *= d
        out.append(f"  {{ float *q = (float *){a.name}; for (long i = 0; i < {n}L; i++)")
        out.append(f"      q[i] = (float)((i * 7919L + {k * 131 + 17}L) % 1009L) / 1009.0f; }}")
    out.append("}")
    out.append("static void kernel(void) {")
    out.append(kernel_c(sched))
    out.append("}")
    if baseline is not None:
        out.append("static void kernel_base(void) {")
        out.append(kernel_c(baseline))
        out.append("}")
    dumps = [f"  fwrite({a.name}, sizeof({a.name}), 1, f);" for a in p.arrays if a.output]
    timed = (
        f"    init();\n    clock_gettime({clock}, &t0);\n    kernel_base();\n"
        f"    clock_gettime({clock}, &t1);\n"
        '    printf("%.9f ", (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));\n'
        if baseline is not None
        else ""
    )
    out.append(
        "int main(int argc, char **argv) {\n"
        "  int reps = argc > 2 ? atoi(argv[2]) : 1;\n"
        "  init();\n  kernel();\n"
        '  FILE *f = fopen(argv[1], "wb");\n  if (!f) return 2;\n' + "\n".join(dumps) + "\n  fclose(f);\n"
        "  for (int r = 0; r < reps; r++) {\n"
        "    struct timespec t0, t1;\n" + timed + "    init();\n"
        f"    clock_gettime({clock}, &t0);\n    kernel();\n"
        f"    clock_gettime({clock}, &t1);\n"
        '    printf("%.9f\\n", (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));\n'
        "  }\n  return 0;\n}\n"
    )
    return "\n".join(out)

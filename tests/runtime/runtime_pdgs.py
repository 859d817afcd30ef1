"""Hand-built PDGs and ASTs for the runtime tests (real ops, real values)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from timerl.pdg.ir import PDG, SLICE_VAR, Edge, Node, TensorSpec
from timerl.pdg.ops import DType, Op, OpKind
from timerl.schedule.ast import AstNode, Dealloc, Exec, If, Loop, Seq
from timerl.symbolic import TRUE, ZERO, Expr, Slice, Sym, lift, smin

i, I = Sym("i"), Sym("I", True)  # noqa: E741
t, T = Sym("t"), Sym("T", True)
c0, c1 = Sym("_c0"), Sym("_c1")
F32 = TensorSpec((), DType.float32)
BOOL = TensorSpec((), DType.bool_)


class Builder:
    """``add`` returns a node id; ``read`` adds a data edge with the next input id."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.edges: list[Edge] = []

    def add(
        self,
        kind: OpKind,
        domain: tuple[Sym, ...] = (),
        outputs: tuple[TensorSpec, ...] = (F32,),
        name: str | None = None,
        cond: Expr = TRUE,
        batch: tuple[int, ...] = (),
        **attrs: Any,
    ) -> int:
        nid = len(self.nodes)
        self.nodes[nid] = Node(nid, Op.make(kind, **attrs), domain, outputs, 0, cond, batch, name, "test")
        return nid

    def read(
        self,
        sink: int,
        src: int,
        phi: tuple[Expr | Slice | int, ...],
        oid: int = 0,
        cond: Expr = TRUE,
        select: Expr | None = None,
        order: bool = False,
    ) -> None:
        iid = -1 if order else sum(1 for e in self.edges if e.sink == sink and not e.order_only)
        phi_e = tuple(p if isinstance(p, Slice) else lift(p) for p in phi)
        self.edges.append(Edge(sink, src, iid, oid, phi_e, cond, select, order))

    def pdg(
        self, dims: tuple[tuple[Sym, Sym], ...], static: dict[Sym, int], dynamic: frozenset[Sym] = frozenset()
    ) -> PDG:
        nodes = {}
        for nid, n in self.nodes.items():
            k = sum(1 for e in self.edges if e.sink == nid and not e.order_only)
            nodes[nid] = Node(n.id, n.op, n.domain, n.outputs, k, n.cond, n.batch, n.name, n.where)
        return PDG(dims, nodes, tuple(self.edges), static, dynamic)


def loop(var: Sym, init: Expr | int, cond: Expr, *body: AstNode, inc: int = 1) -> Loop:
    return Loop(var, lift(init), cond, inc, Seq(tuple(body)))


def ex(nid: int, *pt: Expr | int) -> Exec:
    return Exec(nid, tuple(lift(p) for p in pt))


def free(nid: int, *pt: Expr | int) -> Dealloc:
    return Dealloc(nid, tuple(lift(p) for p in pt))


def const(value: Any, dtype: Any = np.float32) -> dict[str, Any]:
    return {"value": np.asarray(value, dtype=dtype)}


# ---------------------------------------------------------------------------------------------
@dataclass
class Program:
    pdg: PDG
    ast: AstNode
    ids: dict[str, int]
    calls: list[Any] = field(default_factory=list)


def cumsum_program(n: int = 6, dealloc: bool = False, sink_fn: Callable[..., Any] | None = None) -> Program:
    """x[0] = 5, x[t] = x[t-1] + 1 (merge); s[t] = sum(x[t:T]); p[t] = sum(x[0:t]) (empty at 0)."""
    b = Builder()
    c = b.add(OpKind.CONST, name="c", **const(5.0))
    one = b.add(OpKind.CONST, name="one", **const(1.0))
    x = b.add(OpKind.MERGE, (t,), name="x")
    y = b.add(OpKind.ADD, (t,), name="y")
    s = b.add(OpKind.SUM, (t,), name="s", dims=(0,), keepdim=False)
    p = b.add(OpKind.SUM, (t,), name="p", dims=(0,), keepdim=False)
    calls: list[Any] = []
    sk = b.add(OpKind.SINK, (t,), (), name="sink", fn=sink_fn or (lambda v, pt: calls.append((pt, v))))
    b.read(x, c, (), cond=t == 0)
    b.read(x, y, (t - 1,), cond=t > 0)
    b.read(y, x, (t,))
    b.read(y, one, ())
    b.read(s, x, (Slice(t, T),))
    b.read(p, x, (Slice(ZERO, t),))
    b.read(sk, s, (t,))
    acting = [ex(x, c0), ex(y, c0)]
    if dealloc:
        acting.append(If(c0 >= 1, free(y, c0 - 1)))
    ast = Seq(
        (
            ex(c),
            ex(one),
            loop(c0, 0, c0 < T, *acting),
            loop(c0, 0, c0 < T, ex(s, c0), ex(p, c0), ex(sk, c0)),
        )
    )
    ids = {"c": c, "one": one, "x": x, "y": y, "s": s, "p": p, "sink": sk}
    return Program(b.pdg(((t, T),), {T: n}), ast, ids, calls)


def select_program(n: int = 5) -> Program:
    """vj[t] has per-point shape (T - t,); dx[t] = sum_{s <= t} vj[s][t - s] (a VJP-style select edge)."""
    b = Builder()

    def vj_fn(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
        k = pt["t"]
        return [np.arange(n - k, dtype=np.float32) * 10 + k]

    vj = b.add(OpKind.UDF, (t,), (TensorSpec((T - t,), DType.float32),), name="vj", fn=vj_fn)
    dx = b.add(OpKind.SUM, (t,), name="dx", dims=(0,), keepdim=False)
    b.read(dx, vj, (Slice(ZERO, t + 1),), select=t - SLICE_VAR)
    ast = Seq((loop(c0, 0, c0 < T, ex(vj, c0)), loop(c0, 0, c0 < T, ex(dx, c0))))
    return Program(b.pdg(((t, T),), {T: n}), ast, {"vj": vj, "dx": dx})


def batched_program(n: int = 3, reverse: bool = False) -> Program:
    """A batch=(4,) random node mixed with unbatched and EVAL_SYMBOL inputs; a batched slice read."""
    b = Builder()
    u = b.add(
        OpKind.RAND_UNIFORM,
        (t,),
        (TensorSpec((3,), DType.float32),),
        "u",
        batch=(4,),
        shape=(3,),
        dtype=DType.float32,
    )
    w = b.add(OpKind.CONST, (), (TensorSpec((3,), DType.float32),), "w", **const([1.0, 2.0, 3.0]))
    z = b.add(OpKind.MUL, (t,), (TensorSpec((3,), DType.float32),), "z", batch=(4,))
    ev = b.add(OpKind.EVAL_SYMBOL, (t,), (F32,), "ev", batch=(4,), expr=t * 2, dtype=DType.float32)
    z2 = b.add(OpKind.ADD, (t,), (TensorSpec((3,), DType.float32),), "z2", batch=(4,))
    h = b.add(OpKind.SUM, (t,), (F32,), "h", batch=(4,), dims=(0, 1), keepdim=False)
    b.read(z, u, (t,))
    b.read(z, w, ())
    b.read(z2, z, (t,))
    b.read(z2, ev, (t,))
    b.read(h, z2, (Slice(ZERO, t + 1),))
    if reverse:  # a different (still legal) order of the random draws
        ast = Seq(
            (
                ex(w),
                loop(c0, -(T - 1), c0 <= 0, ex(u, -c0)),
                loop(c0, 0, c0 < T, ex(z, c0), ex(ev, c0), ex(z2, c0), ex(h, c0)),
            )
        )
    else:
        ast = Seq((ex(w), loop(c0, 0, c0 < T, ex(u, c0), ex(z, c0), ex(ev, c0), ex(z2, c0), ex(h, c0))))
    return Program(b.pdg(((t, T),), {T: n}), ast, {"u": u, "w": w, "z": z, "ev": ev, "z2": z2, "h": h})


def episode_program(
    ep_len: tuple[int, ...] = (5, 3, 1),
    schedule: str = "mc",
    fail_reset_at: int | None = None,
    window: int = 2,
) -> Program:
    """Episodes of dynamic length T (done when t == ep_len[i] - 1), returns, a per-episode sink.

    reset[i] = 100 i; o[i, 0] = reset[i], o[i, t] = step[i, t-1].obs; step: obs + 1, reward
    0.5 obs, done. ``g`` = MC return sum(r[t:T]); ``gr`` = the same as a backward recurrence
    with 0.9 discount; ``ng`` = n-step return sum(r[t:min(t+n, T)]) (``n = window``); ``tot[i]`` = sum(r[0:T]).

    Schedules: ``mc`` (learn after acting, forward), ``rev`` (backward recurrence loop with
    init ``-T + 1``), ``nstep`` (learning interleaved with acting, needs the lb rule),
    ``split`` (one i loop acting, a second one learning), ``too_early`` (learning loop before acting: BoundError), ``stuck`` (a loop over an
    unknown T without its SET_SYMBOL inside).
    """
    b = Builder()
    calls: list[Any] = []

    def reset_fn(ins: list[np.ndarray], pt: dict[str, int]) -> list[np.ndarray]:
        calls.append(("reset", pt["i"]))
        if fail_reset_at is not None and pt["i"] == fail_reset_at:
            raise ValueError("simulator crashed")
        return [np.float32(100 * pt["i"])]

    def step_fn(ins: list[np.ndarray], pt: dict[str, int]) -> list[Any]:
        calls.append(("step", pt["i"], pt["t"]))
        o = ins[0]
        return [o + 1, o * 0.5, pt["t"] == ep_len[pt["i"]] - 1]

    def sink_fn(v: np.ndarray, pt: dict[str, int]) -> None:
        calls.append(("sink", pt["i"], float(v)))

    reset = b.add(OpKind.UDF, (i,), (F32,), "reset", fn=reset_fn)
    o = b.add(OpKind.MERGE, (i, t), (F32,), "o")
    step = b.add(OpKind.UDF, (i, t), (F32, F32, BOOL), "step", fn=step_fn)
    done = b.add(OpKind.SET_SYMBOL, (i, t), (), "done", bound=T, dim=t)
    g = b.add(OpKind.SUM, (i, t), (F32,), "g", dims=(0,), keepdim=False)
    gamma = b.add(OpKind.CONST, (), (F32,), "gamma", **const(0.9))
    disc = b.add(OpKind.MUL, (i, t), (F32,), "disc", cond=t + 1 < T)
    acc = b.add(OpKind.ADD, (i, t), (F32,), "acc", cond=t + 1 < T)
    gr = b.add(OpKind.MERGE, (i, t), (F32,), "gr")
    ng = b.add(OpKind.SUM, (i, t), (F32,), "ng", dims=(0,), keepdim=False)
    tot = b.add(OpKind.SUM, (i,), (F32,), "tot", dims=(0,), keepdim=False)
    sk = b.add(OpKind.SINK, (i,), (), "sink", fn=sink_fn)
    b.read(o, reset, (i,), cond=t == 0)
    b.read(o, step, (i, t - 1), cond=t > 0)
    b.read(step, o, (i, t))
    b.read(done, step, (i, t), oid=2)
    b.read(g, step, (i, Slice(t, T)), oid=1)
    b.read(disc, gr, (i, t + 1))
    b.read(disc, gamma, ())
    b.read(acc, step, (i, t), oid=1)
    b.read(acc, disc, (i, t))
    b.read(gr, step, (i, t), oid=1, cond=t == T - 1)
    b.read(gr, acc, (i, t), cond=t + 1 < T)
    b.read(ng, step, (i, Slice(t, smin(t + window, T))), oid=1)
    b.read(tot, step, (i, Slice(ZERO, T)), oid=1)
    b.read(sk, tot, (i,))
    b.read(reset, step, (i - 1, 0), order=True, cond=i > 0)  # env order: a reset after the previous episode

    act = (ex(o, c0, c1), ex(step, c0, c1), ex(done, c0, c1))
    tail = (ex(tot, c0), ex(sk, c0))
    if schedule == "mc":
        body = (ex(reset, c0), loop(c1, 0, c1 < T, *act), loop(c1, 0, c1 < T, ex(g, c0, c1)), *tail)
    elif schedule == "rev":
        learn = loop(
            c1,
            -(T - 1),
            c1 <= 0,
            If(c1 >= 2 - T, Seq((ex(disc, c0, -c1), ex(acc, c0, -c1)))),
            ex(gr, c0, -c1),
        )
        body = (ex(reset, c0), loop(c1, 0, c1 < T, *act), learn, *tail)
    elif schedule == "nstep":  # act window - 1 steps ahead of learning
        lead = window - 1
        body = (
            ex(reset, c0),
            loop(c1, 0, c1 <= smin(lead - 1, T - 1), *act),
            loop(c1, lead, c1 < T + lead, If(T >= c1 + 1, Seq(act)), ex(ng, c0, c1 - lead)),
            *tail,
        )
    elif schedule == "split":  # all episodes act, then all learn: T is per episode in both loops
        ast = Seq(
            (
                ex(gamma),
                loop(c0, 0, c0 < I, ex(reset, c0), loop(c1, 0, c1 < T, *act)),
                loop(c0, 0, c0 < I, loop(c1, 0, c1 < T, ex(g, c0, c1)), *tail),
            )
        )
        body = ()
    elif schedule == "too_early":
        body = (ex(reset, c0), loop(c1, -(T - 1), c1 <= 0, ex(g, c0, -c1)), loop(c1, 0, c1 < T, *act), *tail)
    elif schedule == "stuck":
        body = (ex(reset, c0), loop(c1, 0, c1 < T, ex(g, c0, c1)), *tail)
    else:
        raise ValueError(schedule)
    if body:
        ast = Seq((ex(gamma), loop(c0, 0, c0 < I, *body)))
    ids = {
        "reset": reset,
        "o": o,
        "step": step,
        "done": done,
        "g": g,
        "gr": gr,
        "ng": ng,
        "tot": tot,
        "sink": sk,
    }
    pdg = b.pdg(((i, I), (t, T)), {I: len(ep_len)}, frozenset({T}))
    return Program(pdg, ast, ids, calls)


def chain_program(n: int) -> Program:
    """x[0] = 5, x[t] = y[t-1], y[t] = x[t] + 1: a long point-only recurrence."""
    b = Builder()
    c = b.add(OpKind.CONST, name="c", **const(5.0))
    one = b.add(OpKind.CONST, name="one", **const(1.0))
    x = b.add(OpKind.MERGE, (t,), name="x")
    y = b.add(OpKind.ADD, (t,), name="y")
    b.read(x, c, (), cond=t == 0)
    b.read(x, y, (t - 1,), cond=t > 0)
    b.read(y, x, (t,))
    b.read(y, one, ())
    ast = Seq((ex(c), ex(one), loop(c0, 0, c0 < T, ex(x, c0), ex(y, c0), If(c0 >= 1, free(y, c0 - 1)))))
    return Program(b.pdg(((t, T),), {T: n}), ast, {"c": c, "one": one, "x": x, "y": y})

"""Hand-built PDGs for the scheduling tests (structure only; op kinds are arbitrary)."""

from __future__ import annotations

from timerl.pdg.ir import PDG, Edge, Node, TensorSpec
from timerl.pdg.ops import DType, Op, OpKind
from timerl.symbolic import TRUE, ZERO, Expr, Slice, Sym, smin

i, I = Sym("i"), Sym("I", True)  # noqa: E741
t, T = Sym("t"), Sym("T", True)
SCALAR = (TensorSpec((), DType.float32),)


class Builder:
    """Tiny PDG builder: ``node`` returns an id, ``read`` adds a data edge."""

    def __init__(self) -> None:
        self.nodes: dict[int, Node] = {}
        self.edges: list[Edge] = []
        self.names: dict[str, int] = {}

    def node(self, name: str, domain: tuple[Sym, ...], kind: OpKind = OpKind.ADD, cond: Expr = TRUE) -> int:
        nid = len(self.nodes)
        self.nodes[nid] = Node(nid, Op.make(kind), domain, SCALAR, 0, cond=cond, name=name)
        self.names[name] = nid
        return nid

    def read(
        self, sink: str, src: str, phi: tuple[Expr | Slice, ...], cond: Expr = TRUE, order: bool = False
    ) -> None:
        s = self.names[sink]
        iid = sum(1 for e in self.edges if e.sink == s and not e.order_only)
        self.edges.append(Edge(s, self.names[src], -1 if order else iid, 0, phi, cond=cond, order_only=order))

    def pdg(self, dims, static=None, dynamic=frozenset()) -> PDG:
        nodes = {}
        for nid, n in self.nodes.items():
            k = sum(1 for e in self.edges if e.sink == nid and not e.order_only)
            nodes[nid] = Node(n.id, n.op, n.domain, n.outputs, k, cond=n.cond, name=n.name)
        return PDG(tuple(dims), nodes, tuple(self.edges), static or {}, frozenset(dynamic))


def reinforce(n_step: int | None = None, episodes: int = 3) -> tuple[PDG, Builder]:
    """REINFORCE as in the recipe: Monte-Carlo (``n_step=None``) or n-step returns."""
    b = Builder()
    b.node("init", (), OpKind.CONST)
    b.node("w", (i,), OpKind.MERGE)
    b.node("reset", (i,), OpKind.UDF)
    b.node("o", (i, t), OpKind.MERGE)
    b.node("a", (i, t))
    b.node("step", (i, t), OpKind.UDF)
    b.node("g", (i, t), OpKind.DISCOUNTED_SUM)
    b.node("l", (i, t))
    b.node("grad", (i,), OpKind.SUM)
    b.node("update", (i,))
    b.read("w", "init", (), cond=i == 0)
    b.read("w", "update", (i - 1,), cond=i > 0)
    b.read("o", "reset", (i,), cond=t == 0)
    b.read("o", "step", (i, t - 1), cond=t > 0)
    b.read("a", "o", (i, t))
    b.read("a", "w", (i,))
    b.read("step", "a", (i, t))
    stop = T if n_step is None else smin(t + n_step, T)
    b.read("g", "step", (i, Slice(t, stop)))
    b.read("l", "g", (i, t))
    b.read("l", "a", (i, t))
    b.read("l", "w", (i,))
    b.read("grad", "l", (i, Slice(ZERO, T)))
    b.read("update", "w", (i,))
    b.read("update", "grad", (i,))
    b.read("reset", "step", (i - 1, Slice(ZERO, T)), cond=i > 0, order=True)
    return b.pdg([(i, I), (t, T)], {I: episodes}, {T}), b


def ppo_like(epochs: int = 4, window: int = 4) -> tuple[PDG, Builder]:
    """~27 nodes: a deep acting chain, a windowed advantage, K epochs over the episode."""
    k, K = Sym("k"), Sym("K", True)
    b = Builder()
    b.node("init", (), OpKind.CONST)
    b.node("w", (i,), OpKind.MERGE)
    b.node("reset", (i,), OpKind.UDF)
    b.node("o", (i, t), OpKind.MERGE)
    prev = "o"
    for n in range(8):
        b.node(f"act{n}", (i, t))
        b.read(f"act{n}", prev, (i, t))
        b.read(f"act{n}", "w", (i,))
        prev = f"act{n}"
    b.node("step", (i, t), OpKind.UDF)
    b.read("step", prev, (i, t))
    b.read("w", "init", (), cond=i == 0)
    b.read("o", "reset", (i,), cond=t == 0)
    b.read("o", "step", (i, t - 1), cond=t > 0)
    b.node("adv", (i, t))
    b.read("adv", "step", (i, Slice(t, smin(t + window, T))))
    b.node("wk", (i, k), OpKind.MERGE)
    b.read("wk", "w", (i,), cond=k == 0)
    prev = "adv"
    for n in range(10):
        b.node(f"ep{n}", (i, k, t))
        b.read(f"ep{n}", prev, (i, t) if prev == "adv" else (i, k, t))
        b.read(f"ep{n}", "wk", (i, k))
        prev = f"ep{n}"
    b.node("gr", (i, k))
    b.read("gr", prev, (i, k, Slice(ZERO, T)))
    b.read("wk", "gr", (i, k - 1), cond=k > 0)
    b.node("upd", (i,))
    b.read("upd", "gr", (i, K - 1))
    b.read("w", "upd", (i - 1,), cond=i > 0)
    b.read("reset", "step", (i - 1, Slice(ZERO, T)), cond=i > 0, order=True)
    return b.pdg([(i, I), (k, K), (t, T)], {I: 3, K: epochs}, {T}), b

"""A picture of a schedule: the AST's loop nest and statement order, as text and as a PNG.

``outline`` condenses the AST for a reader: each loop is named by the program dim its
counter walks (``for t (_c1 = 0; _c1 < T)``), and each run of consecutive statements is
one line per user source line that defined them, in execution order, with a count::

    for i (_c0 = 0; _c0 <= 2) {
      6 statements
        prog.py:5   dnn = trl.DNNBuilder(domain=(i,)).from_env(env, hidden=[16]).build()  x4
        ...
      for t (_c1 = 0; _c1 < T) {
        23 statements
          prog.py:7   o[b, i, 0] = env.reset(domain=(b, i))  x1

``listing`` is the full AST (``timerl.schedule.ast.pretty``) with every statement named
(``exec %12(_c0, _c1)   # 'adv' merge [i, t]  prog.py:11``). ``plot`` draws the outline as
nested boxes (matplotlib, Agg backend). The picture is read-only: it changes nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from timerl.pdg.ir import PDG, Node
from timerl.schedule.ast import AstNode, Dealloc, Exec, Fetch, If, Loop, MemOp, Offload, Seq, walk
from timerl.symbolic import Sym
from timerl.symbolic.expr import free_symbols, to_str

_MAX_CODE = 72  # characters of a source line shown in the outline
_MAX_ROWS = 400  # rows drawn in the PNG (the text file has them all)


def loop_dims(ast: AstNode, pdg: PDG) -> dict[Sym, str]:
    """Each loop counter's program dim: the domain dim that the statements in its body
    index with it (``_c1 -> "t"``), joined with ``/`` when they differ."""
    out: dict[Sym, str] = {}
    for loop in walk(ast):
        if not isinstance(loop, Loop):
            continue
        seen: Counter[str] = Counter()
        for s in walk(loop.body):
            if isinstance(s, (Exec, *MemOp)) and s.node in pdg.nodes:
                dom = pdg.nodes[s.node].domain
                for d, e in zip(dom, s.point, strict=False):
                    if loop.var in free_symbols(e):
                        seen[d.name] += 1
        out[loop.var] = "/".join(n for n, _ in seen.most_common()) or loop.var.name
    return out


def _source(node: Node) -> tuple[str, str]:
    """``(file:line, code)`` of the user's line that defined ``node``."""
    where = node.where
    loc, _, rest = where.partition(" (")
    code = rest.strip().removesuffix(")").strip("`")
    if len(code) > _MAX_CODE:
        code = code[: _MAX_CODE - 3] + "..."
    return loc, code


def _statement(node: Node | None, s: Exec | Dealloc) -> str:
    """``'adv' merge [i, t]  prog.py:11`` for an annotated listing line."""
    if node is None:
        return f"%{s.node} (not in the PDG)"
    name = f"'{node.name}' " if node.name else ""
    dims = ", ".join(d.name for d in node.domain)
    batch = f" batch over {', '.join(d.name for d in node.batch_dims)}" if node.batch_dims else ""
    return f"{name}{node.op.kind.name.lower()} [{dims}]{batch}  {_source(node)[0]}"


def listing(pdg: PDG, ast: AstNode) -> str:
    """The whole AST, one statement a line, each named: PDG node, op, domain, source line."""
    dims = loop_dims(ast, pdg)
    lines: list[str] = []

    def go(n: AstNode, depth: int) -> None:
        pad = "  " * depth
        if isinstance(n, Seq):
            for c in n.children:
                go(c, depth)
        elif isinstance(n, Loop):
            lines.append(f"{pad}for ({n.var} = {n.init}; {n.cond}; {n.var} += {n.inc}) {{  // {dims[n.var]}")
            go(n.body, depth + 1)
            lines.append(f"{pad}}}")
        elif isinstance(n, If):
            lines.append(f"{pad}if ({n.cond}) {{")
            go(n.then, depth + 1)
            if n.else_ is not None:
                lines.append(f"{pad}}} else {{")
                go(n.else_, depth + 1)
            lines.append(f"{pad}}}")
        else:
            kind = {Dealloc: "free", Offload: "offload", Fetch: "fetch"}.get(type(n), "exec")
            outs = f" outputs {list(n.outputs)}" if getattr(n, "outputs", ()) else ""
            head = f"{pad}{kind} %{n.node}({', '.join(map(to_str, n.point))}){outs}"
            lines.append(f"{head:<40}  # {_statement(pdg.nodes.get(n.node), n)}")

    go(ast, 0)
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Row:
    """One line of the outline: ``depth`` levels in; ``kind`` is loop, if, else, end,
    count (a run of statements) or stmt (one source line of that run)."""

    depth: int
    kind: str
    text: str


def _rows(pdg: PDG, ast: AstNode) -> list[_Row]:
    dims = loop_dims(ast, pdg)
    rows: list[_Row] = []

    def flush(run: list[Exec | Dealloc], depth: int) -> None:
        if not run:
            return
        execs = [s for s in run if isinstance(s, Exec)]
        frees = sum(isinstance(s, Dealloc) for s in run)
        moves = sum(isinstance(s, (Offload, Fetch)) for s in run)
        head = f"{len(execs)} statement{'s' if len(execs) != 1 else ''}"
        head += (f", {frees} frees" if frees else "") + (f", {moves} offloads/fetches" if moves else "")
        rows.append(_Row(depth, "count", head))
        by_line: dict[tuple[str, str], int] = {}
        for s in execs:
            node = pdg.nodes.get(s.node)
            key = _source(node) if node is not None else ("?", f"%{s.node}")
            by_line[key] = by_line.get(key, 0) + 1
        for (loc, code), k in by_line.items():
            rows.append(_Row(depth + 1, "stmt", f"{loc:<12}  {code}  x{k}"))
        run.clear()

    def go(n: AstNode, depth: int, run: list[Exec | Dealloc]) -> None:
        if isinstance(n, Seq):
            for c in n.children:
                go(c, depth, run)
            return
        if isinstance(n, (Exec, *MemOp)):
            run.append(n)
            return
        flush(run, depth)
        if isinstance(n, Loop):
            rows.append(_Row(depth, "loop", f"for {dims[n.var]} ({n.var} = {n.init}; {n.cond}) {{"))
            inner: list[Exec | Dealloc] = []
            go(n.body, depth + 1, inner)
            flush(inner, depth + 1)
        else:
            rows.append(_Row(depth, "if", f"if ({n.cond}) {{"))
            inner = []
            go(n.then, depth + 1, inner)
            flush(inner, depth + 1)
            if n.else_ is not None:
                rows.append(_Row(depth, "else", "} else {"))
                go(n.else_, depth + 1, inner)
                flush(inner, depth + 1)
        rows.append(_Row(depth, "end", "}"))

    top: list[Exec | Dealloc] = []
    go(ast, 0, top)
    flush(top, 0)
    return rows


def outline(pdg: PDG, ast: AstNode) -> str:
    """The loop nest with each run of statements summarised by its source lines."""
    return "\n".join("  " * r.depth + r.text for r in _rows(pdg, ast))


def plot(pdg: PDG, ast: AstNode, path: str | Path, title: str = "schedule") -> Path:
    """Draw the outline as nested boxes (one per loop or branch) into the PNG ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = _rows(pdg, ast)
    cut = len(rows) > _MAX_ROWS
    if cut:
        rows = rows[:_MAX_ROWS]
    n = len(rows) + (1 if cut else 0)
    h, indent = 0.2, 0.35  # inches per row, per nesting level
    fig = plt.figure(figsize=(11, max(1.5, 0.6 + h * n)))
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, 11)
    ax.set_ylim(0.6 + h * n, 0)
    ax.axis("off")
    ax.text(0.1, 0.3, title, fontsize=10, weight="bold", va="center")
    colours = ("#dbe9f6", "#fde6c8", "#dff2dd", "#f2dcef", "#eeeeee")
    opened: list[tuple[int, int]] = []  # (row, depth) of each open box
    for k, r in enumerate(rows):
        y = 0.6 + h * k
        if r.kind in ("loop", "if"):
            opened.append((k, r.depth))
        elif r.kind == "end" and opened:
            start, depth = opened.pop()
            y0 = 0.6 + h * start - h / 2
            x0 = 0.1 + indent * depth
            ax.add_patch(
                Rectangle(
                    (x0, y0),
                    10.8 - x0,
                    h * (k - start + 1),
                    facecolor=colours[depth % len(colours)],
                    edgecolor="#555555",
                    linewidth=0.6,
                    zorder=depth,
                )
            )
            continue
        style = {"loop": "bold", "if": "bold", "else": "bold", "count": "normal"}.get(r.kind, "normal")
        colour = "#555555" if r.kind == "stmt" else "black"
        ax.text(
            0.2 + indent * r.depth,
            y,
            r.text,
            fontsize=7.5,
            family="monospace",
            weight=style,
            color=colour,
            va="center",
            zorder=100,
        )
    if cut:
        ax.text(0.2, 0.6 + h * len(rows), "... (the rest is in the text listing)", fontsize=7.5, va="center")
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_picture(pdg: PDG, ast: AstNode, path: str | Path) -> tuple[Path, Path]:
    """``<path>.txt`` (the outline, then the full annotated listing) and ``<path>.png``
    (the outline drawn); ``path`` may end in ``.txt`` or ``.png``. Returns both paths."""
    base = Path(path)
    if base.suffix in (".txt", ".png"):
        base = base.with_suffix("")
    base.parent.mkdir(parents=True, exist_ok=True)
    txt, png = base.with_name(base.name + ".txt"), base.with_name(base.name + ".png")
    txt.write_text(
        "Schedule outline: loops (named by the dim they walk) and runs of statements, in order\n\n"
        f"{outline(pdg, ast)}\n\nFull listing: every statement (PDG node, op, domain, source line)\n\n"
        f"{listing(pdg, ast)}\n"
    )
    plot(pdg, ast, png, title=base.name)
    return txt, png

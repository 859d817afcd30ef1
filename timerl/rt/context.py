"""``trl.Context``: the symbolic dims of a program and the graph it records into."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from timerl.errors import RTDefinitionError
from timerl.rt.graph import Graph
from timerl.symbolic import Sym

if TYPE_CHECKING:
    from timerl.compile import Executor

_DEFAULT_NAMES = {1: ("t",), 2: ("i", "t"), 3: ("b", "i", "t")}

# The stack of entered contexts (innermost last). Documented module-level state:
# pushed by ``Context.__enter__``, popped by ``__exit__``.
_STACK: list[Context] = []


def current() -> Context:
    """The innermost entered :class:`Context`; error if there is none."""
    if not _STACK:
        raise RTDefinitionError(
            "no timerl Context is active; write the program inside `with trl.Context(...) as dims:`"
        )
    return _STACK[-1]


class Context:
    """Symbolic dims of a program: ``Context(num_dims=3)`` or ``Context(dims=("b", "i", "t"))``.

    ``with ctx as ((b, B), (i, I), (t, T)):`` yields one (index symbol, bound symbol)
    pair per dim, outermost first.
    """

    def __init__(self, num_dims: int | None = None, dims: Sequence[str] | None = None) -> None:
        if dims is None:
            if num_dims is None or num_dims < 0:
                raise RTDefinitionError("Context needs num_dims=n (n >= 0) or dims=('i', 't', ...)")
            dims = _DEFAULT_NAMES.get(num_dims, tuple(f"d{k}" for k in range(num_dims)))
        names = list(dims)
        if len(set(names)) != len(names):
            raise RTDefinitionError(f"dim names must be distinct, got {names}")
        self.dims: tuple[tuple[Sym, Sym], ...] = tuple(
            (Sym(n), Sym(n.upper() if n.upper() != n else n + "_bound", True)) for n in names
        )
        self.graph = Graph()
        self._seeds: list[Any] = []  # losses passed to backward()
        self._grads: dict[tuple[int, int], Any] | None = None

    # -- dims -----------------------------------------------------------------------
    @property
    def index_symbols(self) -> tuple[Sym, ...]:
        return tuple(s for s, _ in self.dims)

    def bound_of(self, sym: Sym) -> Sym:
        for s, b in self.dims:
            if s is sym:
                return b
        raise RTDefinitionError(f"`{sym}` is not a dim of this context (dims: {self.index_symbols})")

    def dim_of_bound(self, bound: Sym) -> Sym:
        for s, b in self.dims:
            if b is bound:
                return s
        raise RTDefinitionError(f"`{bound}` is not a bound symbol of this context")

    def order(self, syms: Sequence[Sym] | frozenset[Sym] | set[Sym]) -> tuple[Sym, ...]:
        """Sort index symbols in context order; unknown symbols are an error."""
        pos = {s: k for k, s in enumerate(self.index_symbols)}
        for s in syms:
            if s not in pos:
                raise RTDefinitionError(
                    f"symbol `{s}` is not a dim of this context (dims: {list(pos)}); "
                    "use the symbols yielded by `with ctx as ...`"
                )
        return tuple(sorted(syms, key=pos.__getitem__))

    # -- with-statement -------------------------------------------------------------
    def __enter__(self) -> tuple[tuple[Sym, Sym], ...]:
        _STACK.append(self)
        return self.dims

    def __exit__(self, *exc: object) -> None:
        _STACK.remove(self)

    # -- compilation ------------------------------------------------------------------
    def compile(self, bounds: Mapping[Any, Any], backend: str = "jax", **options: Any) -> Executor:
        """Lower, optimise, schedule and prepare the program for execution.

        **Arguments:**

        - ``bounds``: one entry per bound symbol: an int (static) or a boolean RT
          (dynamic: the dim ends after the first point where it is true).
        - ``backend``: ``"jax"`` or ``"torch"``.
        - ``options``: pass switches (see :class:`timerl.compile.CompileOptions`).
        """
        from timerl.compile import compile_context

        return compile_context(self, bounds, backend, **options)

"""Symbolic expressions: the index language shared by every layer.

Expressions are immutable and *interned*: structurally equal expressions are the same
object, so identity is structural equality and ``hash`` is cheap. Because ``==`` on an
expression builds an :class:`Eq` node (users write ``(i + 1) % 10 == 0``), use
:func:`same` or ``is`` to compare expressions structurally.

Grammar::

    Expr := Sym | Const | Add(a, b) | Mul(a, b) | FloorDiv(a, b) | Mod(a, b)
          | Min(a, b) | Max(a, b) | Lt(a, b) | Le(a, b) | Eq(a, b) | Ne(a, b)
          | And(a, b) | Or(a, b) | Not(a)
    Slice(start: Expr, stop: Expr)      # only in index positions, not an Expr

The one module-level cache is ``_INTERN``: a weak-valued table keyed by
``(class, args)``; entries vanish when no expression refers to them.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Union

from timerl.errors import SymbolicError

_INTERN: weakref.WeakValueDictionary[tuple[Any, ...], Expr] = weakref.WeakValueDictionary()

ExprLike = Union["Expr", int, bool]


def lift(x: ExprLike) -> Expr:
    """Turn an int/bool (or an Expr) into an Expr."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x)
    if isinstance(x, int):
        return Const(int(x))
    # numpy integers
    try:
        import numbers

        if isinstance(x, numbers.Integral):
            return Const(int(x))
    except ImportError:  # pragma: no cover
        pass
    raise SymbolicError(f"cannot use {x!r} (type {type(x).__name__}) in a symbolic expression")


class Expr:
    """Base of all symbolic expressions. Build them with Python operators."""

    __slots__ = ("__weakref__", "_args")
    _arity: ClassVar[int] = 2
    _op: ClassVar[str] = "?"

    def __new__(cls, *args: Any) -> Expr:
        key = (cls, *args)
        try:
            hit = _INTERN.get(key)
        except TypeError:  # unhashable argument
            raise SymbolicError(f"bad arguments for {cls.__name__}: {args!r}") from None
        if hit is not None:
            return hit
        obj = object.__new__(cls)
        object.__setattr__(obj, "_args", args)
        _INTERN[key] = obj
        return obj

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("symbolic expressions are immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), self._args)

    @property
    def args(self) -> tuple[Any, ...]:
        return self._args

    __hash__ = object.__hash__

    # -- arithmetic ---------------------------------------------------------------
    def __add__(self, o: ExprLike) -> Expr:
        return add(self, o)

    def __radd__(self, o: ExprLike) -> Expr:
        return add(o, self)

    def __sub__(self, o: ExprLike) -> Expr:
        return add(self, mul(-1, o))

    def __rsub__(self, o: ExprLike) -> Expr:
        return add(o, mul(-1, self))

    def __mul__(self, o: ExprLike) -> Expr:
        return mul(self, o)

    def __rmul__(self, o: ExprLike) -> Expr:
        return mul(o, self)

    def __neg__(self) -> Expr:
        return mul(-1, self)

    def __floordiv__(self, o: ExprLike) -> Expr:
        return floordiv(self, o)

    def __rfloordiv__(self, o: ExprLike) -> Expr:
        return floordiv(o, self)

    def __mod__(self, o: ExprLike) -> Expr:
        return mod(self, o)

    def __rmod__(self, o: ExprLike) -> Expr:
        return mod(o, self)

    # -- comparisons build expressions -------------------------------------------
    def __lt__(self, o: ExprLike) -> Expr:
        return cmp_lt(self, o)

    def __le__(self, o: ExprLike) -> Expr:
        return cmp_le(self, o)

    def __gt__(self, o: ExprLike) -> Expr:
        return cmp_lt(o, self)

    def __ge__(self, o: ExprLike) -> Expr:
        return cmp_le(o, self)

    def __eq__(self, o: object) -> Expr:  # type: ignore[override]
        return cmp_eq(self, o)  # type: ignore[arg-type]

    def __ne__(self, o: object) -> Expr:  # type: ignore[override]
        return logical_not(cmp_eq(self, o))  # type: ignore[arg-type]

    # -- boolean logic -----------------------------------------------------------
    def __and__(self, o: ExprLike) -> Expr:
        return logical_and(self, o)

    def __rand__(self, o: ExprLike) -> Expr:
        return logical_and(o, self)

    def __or__(self, o: ExprLike) -> Expr:
        return logical_or(self, o)

    def __ror__(self, o: ExprLike) -> Expr:
        return logical_or(o, self)

    def __invert__(self) -> Expr:
        return logical_not(self)

    def __bool__(self) -> bool:
        if isinstance(self, Const):
            return bool(self.value)
        if isinstance(self, Eq):
            # Python-level `a == b` (e.g. `sym in tuple_of_syms`): structural equality.
            # Expressions are interned, so distinct objects are structurally different.
            return self.args[0] is self.args[1]
        raise SymbolicError(
            f"the truth value of the symbolic expression `{self}` is unknown at trace time; "
            "use it as an index (x[cond]) or in trl.where instead of a Python `if`"
        )

    def __index__(self) -> int:
        if isinstance(self, Const):
            return int(self.value)
        raise SymbolicError(f"`{self}` is symbolic and cannot be used as a Python int")

    def __repr__(self) -> str:
        return to_str(self)

    __str__ = __repr__


class Sym(Expr):
    """A symbol: an index symbol (``t``) or a bound symbol (``T``)."""

    __slots__ = ()

    def __new__(cls, name: str, is_bound: bool = False) -> Sym:
        return super().__new__(cls, name, is_bound)  # type: ignore[return-value]

    @property
    def name(self) -> str:
        return self._args[0]

    @property
    def is_bound(self) -> bool:
        return self._args[1]


class Const(Expr):
    """An integer or boolean constant."""

    __slots__ = ()

    def __new__(cls, value: int | bool) -> Const:
        # bool and int hash equal; keep them apart in the intern table.
        return super().__new__(cls, value, type(value))  # type: ignore[return-value]

    @property
    def value(self) -> int | bool:
        return self._args[0]


class Add(Expr):
    __slots__ = ()
    _op = "+"


class Mul(Expr):
    __slots__ = ()
    _op = "*"


class FloorDiv(Expr):
    __slots__ = ()
    _op = "//"


class Mod(Expr):
    __slots__ = ()
    _op = "%"


class Min(Expr):
    __slots__ = ()
    _op = "min"


class Max(Expr):
    __slots__ = ()
    _op = "max"


class Lt(Expr):
    __slots__ = ()
    _op = "<"


class Le(Expr):
    __slots__ = ()
    _op = "<="


class Eq(Expr):
    __slots__ = ()
    _op = "=="


class And(Expr):
    __slots__ = ()
    _op = "&"


class Or(Expr):
    __slots__ = ()
    _op = "|"


class Not(Expr):
    __slots__ = ()
    _arity = 1
    _op = "~"


BOOL_KINDS = (Lt, Le, Eq, And, Or, Not)


@dataclass(frozen=True, slots=True)
class Slice:
    """A range ``start:stop`` of points along one dim (half-open)."""

    start: Expr
    stop: Expr

    def __repr__(self) -> str:
        return f"{self.start}:{self.stop}"


Index = Expr | Slice

TRUE = Const(True)
FALSE = Const(False)
ZERO = Const(0)
ONE = Const(1)


def is_bool(e: Expr) -> bool:
    """Whether ``e`` is a boolean-valued expression."""
    if isinstance(e, Const):
        return isinstance(e.value, bool)
    return isinstance(e, BOOL_KINDS)


# -- smart constructors (with light folding; see simplify.py for the full rules) -------


def _c(e: Expr) -> int | bool | None:
    return e.value if isinstance(e, Const) else None


def add(a: ExprLike, b: ExprLike) -> Expr:
    a, b = lift(a), lift(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return Const(int(ca) + int(cb))
    from timerl.symbolic.simplify import simplify

    return simplify(Add(a, b))


def mul(a: ExprLike, b: ExprLike) -> Expr:
    a, b = lift(a), lift(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return Const(int(ca) * int(cb))
    from timerl.symbolic.simplify import simplify

    return simplify(Mul(a, b))


def floordiv(a: ExprLike, b: ExprLike) -> Expr:
    a, b = lift(a), lift(b)
    ca, cb = _c(a), _c(b)
    if cb == 0:
        raise SymbolicError(f"division by zero in `{a} // {b}`")
    if ca is not None and cb is not None:
        return Const(int(ca) // int(cb))
    if cb == 1:
        return a
    return FloorDiv(a, b)


def mod(a: ExprLike, b: ExprLike) -> Expr:
    a, b = lift(a), lift(b)
    ca, cb = _c(a), _c(b)
    if cb == 0:
        raise SymbolicError(f"modulo by zero in `{a} % {b}`")
    if ca is not None and cb is not None:
        return Const(int(ca) % int(cb))
    if cb == 1:
        return ZERO
    return Mod(a, b)


def smin(a: ExprLike, b: ExprLike) -> Expr:
    """Symbolic minimum (``trl.min``)."""
    a, b = lift(a), lift(b)
    if a is b:
        return a
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return Const(min(ca, cb))
    from timerl.symbolic.simplify import affine_difference

    d = affine_difference(a, b)
    if d is not None:
        return a if d <= 0 else b
    return Min(a, b)


def smax(a: ExprLike, b: ExprLike) -> Expr:
    """Symbolic maximum (``trl.max``)."""
    a, b = lift(a), lift(b)
    if a is b:
        return a
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return Const(max(ca, cb))
    from timerl.symbolic.simplify import affine_difference

    d = affine_difference(a, b)
    if d is not None:
        return a if d >= 0 else b
    return Max(a, b)


def _cmp(kind: type[Expr], a: ExprLike, b: ExprLike, fn: Any) -> Expr:
    a, b = lift(a), lift(b)
    ca, cb = _c(a), _c(b)
    if ca is not None and cb is not None:
        return Const(bool(fn(ca, cb)))
    from timerl.symbolic.simplify import affine_difference

    d = affine_difference(a, b)
    if d is not None:
        return Const(bool(fn(d, 0)))
    return kind(a, b)


def cmp_lt(a: ExprLike, b: ExprLike) -> Expr:
    return _cmp(Lt, a, b, lambda x, y: x < y)


def cmp_le(a: ExprLike, b: ExprLike) -> Expr:
    return _cmp(Le, a, b, lambda x, y: x <= y)


def cmp_eq(a: ExprLike, b: ExprLike) -> Expr:
    return _cmp(Eq, a, b, lambda x, y: x == y)


def logical_and(a: ExprLike, b: ExprLike) -> Expr:
    a, b = lift(a), lift(b)
    if a is FALSE or b is FALSE:
        return FALSE
    if a is TRUE:
        return b
    if b is TRUE or a is b:
        return a
    return And(a, b)


def logical_or(a: ExprLike, b: ExprLike) -> Expr:
    a, b = lift(a), lift(b)
    if a is TRUE or b is TRUE:
        return TRUE
    if a is FALSE:
        return b
    if b is FALSE or a is b:
        return a
    return Or(a, b)


def logical_not(a: ExprLike) -> Expr:
    a = lift(a)
    if isinstance(a, Const):
        return Const(not a.value)
    if isinstance(a, Not):
        return a.args[0]
    return Not(a)


# -- traversal ----------------------------------------------------------------------


def free_symbols(e: Expr | Slice) -> frozenset[Sym]:
    """All symbols (index and bound) that occur in ``e``."""
    if isinstance(e, Slice):
        return free_symbols(e.start) | free_symbols(e.stop)
    if isinstance(e, Sym):
        return frozenset((e,))
    if isinstance(e, Const):
        return frozenset()
    out: frozenset[Sym] = frozenset()
    for a in e.args:
        out |= free_symbols(a)
    return out


def index_symbols(e: Expr | Slice) -> frozenset[Sym]:
    """Index symbols (not bounds) that occur in ``e``."""
    return frozenset(s for s in free_symbols(e) if not s.is_bound)


def substitute(e: Expr | Slice, mapping: Mapping[Sym, ExprLike]) -> Any:
    """Replace symbols by expressions (simultaneously), re-simplifying the result."""
    if isinstance(e, Slice):
        return Slice(substitute(e.start, mapping), substitute(e.stop, mapping))
    if isinstance(e, Sym):
        return lift(mapping[e]) if e in mapping else e
    if isinstance(e, Const):
        return e
    args = [substitute(a, mapping) for a in e.args]
    return _REBUILD[type(e)](*args)


_REBUILD: dict[type[Expr], Any] = {
    Add: add,
    Mul: mul,
    FloorDiv: floordiv,
    Mod: mod,
    Min: smin,
    Max: smax,
    Lt: cmp_lt,
    Le: cmp_le,
    Eq: cmp_eq,
    And: logical_and,
    Or: logical_or,
    Not: logical_not,
}


def evaluate(e: Expr | Slice, env: Mapping[Sym, int]) -> Any:
    """Evaluate ``e`` with concrete values for its symbols.

    A :class:`Slice` evaluates to a Python ``range``. Raises :class:`SymbolicError` naming
    the missing symbol when ``env`` lacks one.
    """
    if isinstance(e, Slice):
        return range(evaluate(e.start, env), evaluate(e.stop, env))
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Sym):
        try:
            return env[e]
        except KeyError:
            raise SymbolicError(
                f"symbol `{e}` has no value here (known: {sorted(s.name for s in env)})"
            ) from None
    k = type(e)
    if k is Not:
        return not evaluate(e.args[0], env)
    a = evaluate(e.args[0], env)
    if k is And:
        return bool(a) and bool(evaluate(e.args[1], env))
    if k is Or:
        return bool(a) or bool(evaluate(e.args[1], env))
    b = evaluate(e.args[1], env)
    return _EVAL[k](a, b)


_EVAL: dict[type[Expr], Any] = {
    Add: lambda a, b: a + b,
    Mul: lambda a, b: a * b,
    FloorDiv: lambda a, b: a // b,
    Mod: lambda a, b: a % b,
    Min: min,
    Max: max,
    Lt: lambda a, b: a < b,
    Le: lambda a, b: a <= b,
    Eq: lambda a, b: a == b,
}


def to_str(e: Expr | Slice) -> str:
    """Readable form, also valid Python given the symbols."""
    if isinstance(e, Slice):
        return repr(e)
    if isinstance(e, Sym):
        return e.name
    if isinstance(e, Const):
        return repr(e.value)
    k = type(e)
    if k is Not:
        return f"~({to_str(e.args[0])})"
    if k in (Min, Max):
        return f"{k._op}({to_str(e.args[0])}, {to_str(e.args[1])})"
    if k is Add:
        a, b = e.args
        if isinstance(b, Mul) and isinstance(b.args[0], Const) and b.args[0].value == -1:
            return f"{_paren(a, Add)} - {_paren(b.args[1], Mul)}"
        if isinstance(b, Const) and b.value < 0:
            return f"{_paren(a, Add)} - {-b.value}"
        return f"{_paren(a, Add)} + {_paren(b, Add)}"
    if k is Mul and isinstance(e.args[0], Const) and e.args[0].value == -1:
        return f"-{_paren(e.args[1], Mul)}"
    return f"{_paren(e.args[0], k)} {k._op} {_paren(e.args[1], k)}"


def _paren(e: Expr, parent: type[Expr]) -> str:
    s = to_str(e)
    if isinstance(e, (Sym, Const, Min, Max, Not)) or type(e) is parent:
        return s
    return f"({s})"


def same(a: Expr | Slice | int, b: Expr | Slice | int) -> bool:
    """Structural equality of expressions (``==`` builds an :class:`Eq` instead)."""
    if isinstance(a, Slice) or isinstance(b, Slice):
        return isinstance(a, Slice) and isinstance(b, Slice) and a.start is b.start and a.stop is b.stop
    return lift(a) is lift(b)

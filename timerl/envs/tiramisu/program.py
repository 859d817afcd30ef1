"""Polyhedral loop-nest programs: arrays, statements (domain, accesses, body) and the
original loop structure.

A :class:`Program` is a list of :class:`Statement` s. Each statement has iterators, an
iteration domain (isl constraints over its iterators, concrete sizes), one write and
some reads (:class:`Access`: one affine index expression per array dim) and a body: a C
expression in which ``{k}`` stands for the k-th read. The original loop nest is given by
``betas`` (the 2d+1 form): statement ``S`` with iterators ``(i, j)`` and betas
``(b0, b1, b2)`` runs at schedule time ``[b0, i, b1, j, b2]``; two statements share a
loop as long as their betas agree before it.

A *branch* (Tiramisu's unit of transformation) is a set of statements with the same
iterators and the same betas except the last one (they share every loop).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

import islpy as isl

from timerl.errors import TimeRLError

__all__ = [
    "MAX_ARRAY_DIMS",
    "MAX_DEPTH",
    "MAX_READS",
    "Access",
    "Array",
    "Program",
    "Statement",
    "UnsupportedProgramError",
    "affine_row",
]

MAX_DEPTH = 5  # loop levels per statement (the paper's R(i) ranges over 0..4)
MAX_READS = 10  # read accesses per statement (each an access matrix in the state)
MAX_ARRAY_DIMS = 4  # rows of an access matrix

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class UnsupportedProgramError(TimeRLError):
    """A loop nest the Tiramisu environment cannot represent (too deep, non-affine access, ...)."""


@dataclass(frozen=True)
class Array:
    """A float32 array with a concrete shape; ``output`` arrays are checked against the reference."""

    name: str
    shape: tuple[int, ...]
    output: bool = False


@dataclass(frozen=True)
class Access:
    """``array[index[0], index[1], ...]``: each index an affine expression of the iterators
    in isl syntax (``"i"``, ``"j + 1"``, ``"2*i - j"``)."""

    array: str
    index: tuple[str, ...]


@dataclass(frozen=True)
class Statement:
    """One computation: ``write = body(reads)`` over ``domain``."""

    name: str
    iterators: tuple[str, ...]
    domain: str  # isl constraints over the iterators, e.g. "0 <= i < 100 and 0 <= j < i"
    write: Access
    reads: tuple[Access, ...]
    body: str  # C expression, {k} is the k-th read
    betas: tuple[int, ...]  # len(iterators) + 1 (2d+1 form)

    @property
    def depth(self) -> int:
        return len(self.iterators)

    def isl_domain(self) -> str:
        return f"{self.name}[{', '.join(self.iterators)}] : {self.domain}"

    def access_map(self, acc: Access) -> str:
        return f"{self.name}[{', '.join(self.iterators)}] -> {acc.array}[{', '.join(acc.index)}]"


@dataclass(frozen=True)
class Program:
    """A loop-nest program (see the module doc). Construction checks that it is representable."""

    name: str
    arrays: tuple[Array, ...]
    statements: tuple[Statement, ...]

    def __post_init__(self) -> None:
        _validate(self)

    @functools.cached_property
    def ctx(self) -> isl.Context:
        return isl.Context()

    @functools.cached_property
    def uid(self) -> str:
        """``name-<hash>``: the name plus a hash of the whole program (sizes, bodies), so
        caches never confuse two programs of one name."""
        h = hashlib.sha256(repr((self.arrays, self.statements)).encode()).hexdigest()[:10]
        return f"{self.name}-{h}"

    @property
    def array_map(self) -> dict[str, Array]:
        return {a.name: a for a in self.arrays}

    def statement(self, name: str) -> Statement:
        for s in self.statements:
            if s.name == name:
                return s
        raise TimeRLError(f"program {self.name}: no statement {name!r}")

    def domain(self) -> isl.UnionSet:
        return isl.UnionSet.read_from_str(
            self.ctx, "{ " + "; ".join(s.isl_domain() for s in self.statements) + " }"
        )

    def reads(self) -> isl.UnionMap:
        parts = [s.access_map(r) for s in self.statements for r in s.reads]
        return isl.UnionMap.read_from_str(self.ctx, "{ " + "; ".join(parts) + " }").intersect_domain(
            self.domain()
        )

    def writes(self) -> isl.UnionMap:
        parts = [s.access_map(s.write) for s in self.statements]
        return isl.UnionMap.read_from_str(self.ctx, "{ " + "; ".join(parts) + " }").intersect_domain(
            self.domain()
        )

    @functools.cached_property
    def branches(self) -> tuple[tuple[str, ...], ...]:
        """Statement names grouped into branches, in program order."""
        groups: dict[tuple, list[str]] = {}
        for s in self.statements:
            groups.setdefault((s.iterators, s.betas[:-1]), []).append(s.name)
        return tuple(tuple(g) for g in groups.values())

    @property
    def flops_points(self) -> int:
        """Statement instances in total (a size measure)."""
        return int(sum(_card(self.ctx, s.isl_domain()) for s in self.statements))


def _card(ctx: isl.Context, dom: str) -> int:
    return int(isl.Set.read_from_str(ctx, "{ " + dom + " }").count_val().to_python())


def affine_row(expr: str, iterators: Sequence[str]) -> list[int]:
    """Coefficients of ``expr`` over ``iterators`` followed by its constant (an access-matrix row).

    Raises :class:`UnsupportedProgramError` for a non-affine or non-integer expression.
    """
    ctx = isl.DEFAULT_CONTEXT
    try:
        aff = isl.Aff.read_from_str(ctx, f"{{ [{', '.join(iterators)}] -> [({expr})] }}")
    except isl.Error as e:
        raise UnsupportedProgramError(
            f"index expression {expr!r} over {tuple(iterators)} is not an affine expression isl can read"
        ) from e
    if aff.dim(isl.dim_type.div) > 0:
        raise UnsupportedProgramError(
            f"index expression {expr!r} uses floor/mod: only c0*i0 + ... + c is supported in accesses"
        )
    row = [aff.get_coefficient_val(isl.dim_type.in_, k).to_python() for k in range(len(iterators))]
    row.append(aff.get_constant_val().to_python())
    if any(int(v) != v for v in row):
        raise UnsupportedProgramError(f"index expression {expr!r} has non-integer coefficients")
    return [int(v) for v in row]


def _validate(p: Program) -> None:
    names = [a.name for a in p.arrays]
    if len(set(names)) != len(names):
        raise UnsupportedProgramError(f"program {p.name}: duplicate array names {names}")
    arrays = {a.name: a for a in p.arrays}
    if not p.statements:
        raise UnsupportedProgramError(f"program {p.name}: no statements")
    snames = [s.name for s in p.statements]
    if len(set(snames)) != len(snames):
        raise UnsupportedProgramError(f"program {p.name}: duplicate statement names {snames}")
    for s in p.statements:
        where = f"program {p.name}, statement {s.name}"
        if not 1 <= s.depth <= MAX_DEPTH:
            raise UnsupportedProgramError(
                f"{where}: {s.depth} loop levels; the environment represents 1..{MAX_DEPTH} "
                "(the 56 actions address levels 0..4)"
            )
        if len(s.betas) != s.depth + 1:
            raise UnsupportedProgramError(
                f"{where}: betas must have len(iterators) + 1 = {s.depth + 1} entries"
            )
        if len(s.reads) > MAX_READS:
            raise UnsupportedProgramError(
                f"{where}: {len(s.reads)} reads; the state holds at most {MAX_READS} read access matrices"
            )
        for acc in (s.write, *s.reads):
            if acc.array not in arrays:
                raise UnsupportedProgramError(f"{where}: access to unknown array {acc.array!r}")
            arr = arrays[acc.array]
            if len(acc.index) != len(arr.shape):
                raise UnsupportedProgramError(
                    f"{where}: {acc.array} has {len(arr.shape)} dims, accessed with {len(acc.index)} indices"
                )
            if len(arr.shape) > MAX_ARRAY_DIMS:
                raise UnsupportedProgramError(
                    f"{where}: array {acc.array} has more than {MAX_ARRAY_DIMS} dims"
                )
            for e in acc.index:
                affine_row(e, s.iterators)
        for k in range(len(s.reads)):
            if "{" + str(k) + "}" not in s.body:
                raise UnsupportedProgramError(f"{where}: body {s.body!r} does not use read {{{k}}}")
        try:
            dom = isl.Set.read_from_str(p.ctx, "{ " + s.isl_domain() + " }")
        except isl.Error as e:
            raise UnsupportedProgramError(f"{where}: cannot parse the domain {s.domain!r}") from e
        if not dom.is_bounded():
            raise UnsupportedProgramError(f"{where}: the domain {s.domain!r} is unbounded")
        # every access inside the array's bounds
        for acc in (s.write, *s.reads):
            arr = arrays[acc.array]
            img = isl.Map.read_from_str(p.ctx, "{ " + s.access_map(acc) + " }").intersect_domain(dom).range()
            box = isl.Set.read_from_str(
                p.ctx,
                "{ "
                + f"{acc.array}[{', '.join(f'a{k}' for k in range(len(arr.shape)))}] : "
                + " and ".join(f"0 <= a{k} < {n}" for k, n in enumerate(arr.shape))
                + " }",
            )
            if not img.is_subset(box):
                raise UnsupportedProgramError(
                    f"{where}: access {acc.array}[{', '.join(acc.index)}] leaves the array's bounds {arr.shape}"
                )


def body_c(s: Statement, macro_args: Sequence[str]) -> str:
    """The statement as a C assignment with the iterators replaced by ``macro_args``."""
    sub = dict(zip(s.iterators, macro_args, strict=True))

    def ref(acc: Access) -> str:
        idx = "".join(
            f"[{_IDENT.sub(lambda m: f'({sub[m.group(0)]})' if m.group(0) in sub else m.group(0), e)}]"
            for e in acc.index
        )
        return acc.array + idx

    return f"{ref(s.write)} = {s.body.format(*[ref(r) for r in s.reads])}"

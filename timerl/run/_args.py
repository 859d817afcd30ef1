"""Command-line flags from an ``Args`` dataclass, CleanRL-style: one ``--flag`` per field,
its ``--help`` line taken from the docstring written under the field."""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TypeVar

from timerl.backends import BACKEND_NAMES
from timerl.errors import TimeRLError

A = TypeVar("A")


@dataclass
class RunArgs:
    """Flags every training script takes; an example's ``Args`` subclasses it, and may give
    a field another default and docstring by declaring it again (it keeps its place)."""

    backend: str = "jax"
    """tensor backend: jax or torch"""
    seed: int = 0
    """random seed"""
    out_dir: str = "runs"
    """run directory: metrics.csv, TensorBoard events, learning_curve.png"""
    quiet: bool = False
    """no progress bar (the per-iteration lines are still printed)"""
    show_schedule: bool = False
    """write the compiled schedule's loops and statement order to schedule.txt and
    schedule.png in --out-dir (and log its outline)"""
    resume: str = ""
    """continue from a checkpoint (a ckpt_<i>.json/.npz file, or a directory: its latest)"""
    checkpoint_every: int = 0
    """write a checkpoint every this many iterations (0: never)"""
    checkpoint_dir: str = "checkpoints"
    """where checkpoints go (ckpt_<i>.npz + ckpt_<i>.json)"""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (``x: int = 0`` then ``\"\"\"what x is\"\"\"``),
    base classes first so that a subclass's docstring wins, as CleanRL/tyro read them."""
    docs: dict[str, str] = {}
    for k in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(k)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for a, b in zip(body, body[1:], strict=False):
            if (
                isinstance(a, ast.AnnAssign)
                and isinstance(a.target, ast.Name)
                and isinstance(b, ast.Expr)
                and isinstance(b.value, ast.Constant)
                and isinstance(b.value.value, str)
            ):
                docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _parse_bool(s: str) -> bool:
    v = s.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false/1/0, got {s!r}")


def parse_args(
    cls: type[A],
    defaults: A | None = None,
    description: str = "",
    argv: Sequence[str] | None = None,
    check: Callable[[A], None] | None = None,
) -> A:
    """An instance of dataclass ``cls`` from the command line (``argv``, default ``sys.argv``).

    Every field ``name`` becomes ``--name`` with underscores as dashes, typed like its
    default; a boolean flag alone means true (``--quiet``) and takes a value too
    (``--quiet false``). ``--help`` lists each flag with its field's docstring and its
    default, which comes from ``defaults`` when given (a variant's settings), else ``cls()``.
    ``check(args)``, where given, may raise a ``TimeRLError`` naming a flag: it is then a usage
    error (the message after the usage line, exit status 2), not a traceback.
    """
    d = defaults if defaults is not None else cls()
    docs = field_docs(cls)
    p = argparse.ArgumentParser(
        description=description or None, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for f in fields(cls):  # type: ignore[arg-type]
        v = getattr(d, f.name)
        flag = f"--{f.name.replace('_', '-')}"
        doc = docs.get(f.name, " ").replace("%", "%%")
        if f.name == "backend":  # a typo fails here, not after the program is built
            p.add_argument(flag, choices=BACKEND_NAMES, default=v, help=doc, metavar="{jax,torch}")
        elif isinstance(v, bool):
            p.add_argument(flag, type=_parse_bool, nargs="?", const=True, default=v, help=doc, metavar="BOOL")
        elif isinstance(v, tuple):  # a list of words: --sweep lr=1e-3,3e-3 ent_coef=0,0.01
            p.add_argument(flag, nargs="*", type=str, default=v, help=doc, metavar="ITEM")
        else:
            p.add_argument(flag, type=type(v), default=v, help=doc, metavar=type(v).__name__.upper())
    got = vars(p.parse_args(argv))
    args = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in got.items()})
    if check is not None:
        try:
            check(args)
        except TimeRLError as e:
            p.error(str(e))
    return args

"""Shared by the examples: CleanRL-style flags from an ``Args`` dataclass, checkpointing, compile."""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

import timerl as trl

A = TypeVar("A")


@dataclass
class CheckpointArgs:
    """Flags every example takes for checkpoints (fields come after the example's own)."""

    resume: str = ""
    """continue from a checkpoint (a ckpt_<i>.json/.npz file, or a directory: its latest)"""
    checkpoint_every: int = 0
    """write a checkpoint every this many iterations (0: never)"""
    checkpoint_dir: str = "checkpoints"
    """where checkpoints go (ckpt_<i>.npz + ckpt_<i>.json)"""


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (``x: int = 0`` then ``\"\"\"what x is\"\"\"``),
    base classes first, as CleanRL/tyro read them, for ``--help``."""
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


def parse_args(cls: type[A], defaults: A | None, description: str) -> A:
    """``--field-name value`` for every field of ``cls`` (booleans take true/false/1/0), with
    each field's docstring and default as its ``--help`` line."""
    d = defaults if defaults is not None else cls()
    docs = field_docs(cls)
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for f in fields(cls):  # type: ignore[arg-type]
        v = getattr(d, f.name)
        flag = f"--{f.name.replace('_', '-')}"
        doc = docs.get(f.name, " ").replace("%", "%%")
        if isinstance(v, bool):
            p.add_argument(
                flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=v, help=doc, metavar="BOOL"
            )
        else:
            p.add_argument(flag, type=type(v), default=v, help=doc, metavar=type(v).__name__.upper())
    return cls(**vars(p.parse_args()))


def checkpoint_and_compile(
    ctx: trl.Context, args: Any, dnn: Any, i: Any, bounds: dict, **options: Any
) -> Any:
    """Add the periodic checkpoint (last, so other ops keep their ids and RNG streams) and
    compile (``options``: compile options, e.g. passes switched off)."""
    if args.checkpoint_every > 0:
        dnn[(i + 1) % args.checkpoint_every == 0].checkpoint(args.checkpoint_dir, config=asdict(args))
    resume = {"resume": args.resume} if args.resume else {}
    return ctx.compile(bounds, backend=args.backend, seed=args.seed, **resume, **options)

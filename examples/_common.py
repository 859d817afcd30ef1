"""Shared by the examples: CleanRL-style flags from an ``Args`` dataclass, checkpointing, compile."""

from __future__ import annotations

import argparse
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


def parse_args(cls: type[A], defaults: A | None, description: str) -> A:
    """``--field-name value`` for every field of ``cls`` (booleans take true/false/1/0)."""
    d = defaults if defaults is not None else cls()
    p = argparse.ArgumentParser(description=description)
    for f in fields(cls):  # type: ignore[arg-type]
        v = getattr(d, f.name)
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(v, bool):
            p.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=v)
        else:
            p.add_argument(flag, type=type(v), default=v)
    return cls(**vars(p.parse_args()))


def checkpoint_and_compile(
    ctx: trl.Context, args: Any, dnn: Any, i: Any, bounds: dict, **options: Any
) -> Any:
    """Add the periodic checkpoint (last, so other ops keep their ids and RNG streams) and compile;
    ``options`` are more compile options (e.g. ``vectorize_time=False``, see ``CompileOptions``)."""
    if args.checkpoint_every > 0:
        dnn[(i + 1) % args.checkpoint_every == 0].checkpoint(args.checkpoint_dir, config=asdict(args))
    resume = {"resume": args.resume} if args.resume else {}
    return ctx.compile(bounds, backend=args.backend, seed=args.seed, **resume, **options)

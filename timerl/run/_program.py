"""Compiling a training script's program with its run flags, and the script's logging."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from timerl.run._args import RunArgs

if TYPE_CHECKING:
    from timerl.compile import Executor
    from timerl.rt.context import Context
    from timerl.symbolic import Sym

log = logging.getLogger("timerl.run")


def setup_logging(level: int = logging.WARNING) -> None:
    """Log records of ``level`` and above to stderr, and the run's own notices (files
    written, the schedule's outline) from the ``timerl.run`` logger at INFO."""
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)


def checkpoint_and_compile(
    ctx: Context, args: RunArgs, dnn: Any, i: Sym, bounds: dict[Sym, Any], **options: Any
) -> Executor:
    """``ctx.compile(bounds, backend=args.backend, seed=args.seed, **options)`` with the run
    flags applied: with ``--checkpoint-every K`` the program checkpoints (``dnn``'s params
    and all carried state) after every K-th iteration of dim ``i``, with ``--resume`` it
    continues from a checkpoint, and with ``--show-schedule`` the compiled schedule is
    written to ``<out_dir>/schedule.txt`` and ``schedule.png``.

    The checkpoint is added last, so the program's other ops keep their ids (and random
    streams) with checkpoints on or off. Returns the ``Executor``."""
    if args.checkpoint_every > 0:
        dnn[(i + 1) % args.checkpoint_every == 0].checkpoint(args.checkpoint_dir, config=asdict(args))
    resume = {"resume": args.resume} if args.resume else {}
    ex = ctx.compile(bounds, backend=args.backend, seed=args.seed, **resume, **options)
    if args.show_schedule:
        show_schedule(ex, Path(args.out_dir) / "schedule")
    return ex


def show_schedule(executor: Executor, path: str | Path) -> tuple[Path, Path]:
    """Write ``executor``'s schedule picture (``<path>.txt``, ``<path>.png``) and log its outline."""
    from timerl.schedule.picture import outline

    txt, png = executor.plot_schedule(path)
    log.info(
        "schedule (full listing: %s, picture: %s):\n%s",
        txt,
        png,
        outline(executor.pdg, executor.schedule.ast),
    )
    return txt, png

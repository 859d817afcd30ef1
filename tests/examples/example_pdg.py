"""Lower an example program to its PDG without running it (capture ``ctx.compile``'s arguments)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import timerl as trl
from timerl.compile import CompileOptions, build_pdg
from timerl.pdg.ir import PDG

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import dqn_looptune as dqn  # noqa: E402  (the example programs, re-exported for the tests)
import ppo  # noqa: E402
import reinforce  # noqa: E402

__all__ = ["dqn", "lower_example", "ppo", "reinforce"]


def lower_example(
    build: Callable[..., Any], args: Any, *build_args: Any, seed: int = 0, **options: Any
) -> PDG:
    """``build(args, *build_args)`` with compile intercepted; the PDG it would compile (with
    the compile ``options`` given here)."""
    captured: dict[str, Any] = {}

    def fake_compile(self: trl.Context, bounds: Any, **kw: Any) -> None:
        captured["ctx"], captured["bounds"] = self, bounds

    orig = trl.Context.compile
    trl.Context.compile = fake_compile  # type: ignore[method-assign]
    try:
        build(args, *build_args)
    finally:
        trl.Context.compile = orig  # type: ignore[method-assign]
    return build_pdg(captured["ctx"], captured["bounds"], CompileOptions(seed=seed, **options))

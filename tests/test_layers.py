"""The compiler's layers import one way (``docs/architecture.md``): every ``import`` in the
package, at module level or inside a function, is checked against the table below, read
from the source files, so a new upward import fails here with the file that makes it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "timerl"

# package -> the compiler packages it may import (besides itself and the base modules)
ALLOWED: dict[str, frozenset[str]] = {
    "symbolic": frozenset(),
    "pdg": frozenset({"symbolic"}),
    "rt": frozenset({"symbolic", "pdg"}),
    "schedule": frozenset({"symbolic", "pdg"}),
    "plan": frozenset({"symbolic", "pdg", "schedule"}),
    "backends": frozenset({"symbolic", "pdg"}),
    "runtime": frozenset({"symbolic", "pdg", "schedule", "plan", "backends"}),
}
BASE = frozenset({"errors", "units"})  # timerl/errors.py, timerl/units.py: importable from anywhere
# the one call upwards: ``Context.compile`` (the user's entry point) runs the driver
DRIVER = ("timerl.rt.context", "timerl.compile")


def _imports() -> list[tuple[str, str]]:
    """``(importing module, imported module)`` for every import of a ``timerl`` module."""
    out = []
    for f in sorted(ROOT.rglob("*.py")):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for n in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                names = [n.module]
            elif isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            else:
                continue
            out.extend((mod, m) for m in names if m == "timerl" or m.startswith("timerl."))
    return out


def _layer(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_layers_import_one_way() -> None:
    found = _imports()
    assert len(found) > 200, "the import scan found too few imports to be reading the package"
    bad = []
    for src, dst in found:
        a, b = _layer(src), _layer(dst)
        if a not in ALLOWED or a == b or b in BASE or (src, dst) == DRIVER:
            continue
        if b not in ALLOWED[a]:
            bad.append(f"{src} imports {dst} ({a} may import {sorted(ALLOWED[a]) or 'no other layer'})")
    assert not bad, "imports against the layer order:\n" + "\n".join(sorted(set(bad)))


def test_layer_table_has_no_cycle() -> None:
    seen: dict[str, int] = {}

    def visit(a: str) -> None:
        assert seen.get(a) != 1, f"the layer table has a cycle through {a}"
        if seen.get(a) == 2:
            return
        seen[a] = 1
        for b in ALLOWED[a]:
            visit(b)
        seen[a] = 2

    for a in ALLOWED:
        visit(a)


def test_base_modules_import_no_layer() -> None:
    for src, dst in _imports():
        if src.split(".")[-1] in BASE and src.count(".") == 1:
            assert _layer(dst) in BASE, f"{src} imports {dst}: base modules import no compiler layer"

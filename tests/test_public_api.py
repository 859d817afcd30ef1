"""The public API: ``timerl.__all__`` is exactly what ``docs/api.md`` documents (every
``trl.<name>`` there), both ways; ``import timerl`` is light (agents and environments are
imported on first use)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import timerl as trl

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api.md"


def _documented() -> set[str]:
    """The top-level names ``docs/api.md`` documents: ``trl.<name>`` in its code spans."""
    spans = re.findall(r"`([^`]+)`", API.read_text())
    return {m for s in spans for m in re.findall(r"\btrl\.([A-Za-z_]\w*)", s)}


def test_all_equals_what_docs_api_documents() -> None:
    documented, exported = _documented(), set(trl.__all__)
    assert not documented - exported, (
        f"documented in docs/api.md, not in __all__: {sorted(documented - exported)}"
    )
    assert not exported - documented, (
        f"in __all__, not documented in docs/api.md: {sorted(exported - documented)}"
    )
    assert len(trl.__all__) == len(exported), "duplicates in __all__"


def test_every_exported_name_resolves() -> None:
    for name in trl.__all__:
        assert getattr(trl, name) is not None, name
    assert callable(trl.env.make) and hasattr(trl.agents, "ppo")
    from timerl import env  # the lazy names import with ``from timerl import ...`` too

    assert env is trl.env


def test_error_hierarchy_is_exported() -> None:
    import timerl.errors as errors

    classes = {n for n, v in vars(errors).items() if isinstance(v, type) and issubclass(v, Exception)}
    assert classes <= set(trl.__all__), sorted(classes - set(trl.__all__))
    assert all(issubclass(getattr(trl, n), trl.TimeRLError) for n in classes)
    assert issubclass(trl.MemoryBudgetError, trl.TimeRLError)


def test_import_timerl_is_light() -> None:
    """A fresh interpreter: ``import timerl`` loads no agent, no environment and no gymnasium;
    ``trl.env`` then imports the environments."""
    code = (
        "import sys, timerl as trl\n"
        "heavy = [m for m in sys.modules if m.startswith(('timerl.agents', 'timerl.envs', 'gymnasium'))]\n"
        "print(repr(heavy))\n"
        "trl.env\n"
        "print('timerl.envs' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True
    )
    first, second = out.stdout.split("\n")[:2]
    assert first == "[]", f"import timerl loaded {first}"
    assert second == "True"

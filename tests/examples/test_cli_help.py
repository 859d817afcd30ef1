"""Every example's ``--help`` lists each flag with the docstring of its ``Args`` field."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))


@pytest.mark.parametrize("name", ["ppo", "reinforce"])
def test_help_shows_every_field_doc(name: str) -> None:
    import _common

    mod = __import__(name)
    docs = _common.field_docs(mod.Args)
    names = [f.name for f in fields(mod.Args)]
    assert set(names) <= set(docs), f"fields without a docstring: {sorted(set(names) - set(docs))}"
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / f"{name}.py"), "--help"], capture_output=True, text=True, timeout=120
    ).stdout
    flat = " ".join(out.split())
    for n in names:
        assert f"--{n.replace('_', '-')}" in out
        assert " ".join(docs[n].split()[:4]) in flat, n

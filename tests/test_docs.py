"""``docs/tutorial.md`` runs: its Python blocks, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"


def test_tutorial_code_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) >= 6
    ns: dict = {"__name__": "tutorial"}
    for k, src in enumerate(blocks):
        exec(compile(src, f"{DOC.name} block {k + 1}", "exec"), ns)  # noqa: S102

"""Every ```python block of the documentation site (``docs/``) runs: per page, in order, in
one namespace, so what a page shows is what timerl does today. A block whose first line is a
``# skip: <reason>`` comment (a sketch, or one that needs a long run or an optional extra) is
not run; each such block is reported as a skipped test with its reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
SKIP = re.compile(r"#\s*skip:\s*(.+)")


def _blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)


def _skip_reason(src: str) -> str | None:
    m = SKIP.match(src.lstrip().splitlines()[0]) if src.strip() else None
    return m.group(1).strip() if m else None


PAGES = sorted(p for p in DOCS.rglob("*.md") if any(not _skip_reason(b) for b in _blocks(p)))
ALL = sorted(p for p in DOCS.rglob("*.md") if _blocks(p))
SKIPPED = [(p, k, r) for p in ALL for k, src in enumerate(_blocks(p)) if (r := _skip_reason(src))]


def _name(page: Path) -> str:
    return str(page.relative_to(DOCS))


def test_tutorial_has_its_steps() -> None:
    assert len(_blocks(DOCS / "tutorial.md")) >= 6


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_page_code_blocks_run(page: Path) -> None:
    ns: dict = {"__name__": f"docs.{page.stem}"}
    for k, src in enumerate(_blocks(page)):
        if not _skip_reason(src):
            exec(compile(src, f"{_name(page)} block {k + 1}", "exec"), ns)  # noqa: S102


@pytest.mark.parametrize(("page", "k", "reason"), SKIPPED, ids=[f"{_name(p)}-{k + 1}" for p, k, _ in SKIPPED])
def test_skipped_blocks_are_reported(page: Path, k: int, reason: str) -> None:
    pytest.skip(f"{_name(page)} block {k + 1} not run: {reason}")

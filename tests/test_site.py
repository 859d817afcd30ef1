"""The documentation site builds with ``mkdocs build --strict`` (no broken links, no missing
pages, the API reference generated from the docstrings), and every internal link of the built
HTML (navigation, assets, ``#anchors``) reaches an existing file and anchor.

The rendered pages are checked in a headless browser by ``tools/site_screenshots.py``."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None,
    reason="mkdocs / mkdocstrings not installed (pip install -e '.[docs]')",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mkdocs") / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_mkdocs_build_strict(site: Path) -> None:
    for page in ("index.html", "reference/index.html", "api/index.html", "tutorial/index.html"):
        assert (site / page).exists(), page
    assert 'id="timerl.rt.context.Context"' in (site / "reference" / "index.html").read_text()


class _Page(HTMLParser):
    """The ``id``s (and ``<a name>``s) of one HTML page, its ``href`` / ``src`` values and the
    text of its paragraphs."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.paragraphs: list[str] = []
        self._in_p = False

    def handle_data(self, data: str) -> None:
        if self._in_p:
            self.paragraphs[-1] += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "p":
            self._in_p = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "p":
            self._in_p = True
            self.paragraphs.append("")
        for name, value in attrs:
            if value is None:
                continue
            if name == "id" or (tag == "a" and name == "name"):
                self.ids.add(value)
            elif name in ("href", "src"):
                self.links.append(value)


def _target(site: Path, page: Path, path: str) -> Path:
    """The file a link's path names: relative to the page's folder, or to the site root when it
    starts with ``/``; a folder means its ``index.html``."""
    base = site if path.startswith("/") else page.parent
    target = (base / unquote(path.lstrip("/"))).resolve()
    return target / "index.html" if target.is_dir() else target


def _parse(site: Path) -> dict[Path, _Page]:
    pages = {}
    for html in sorted(site.rglob("*.html")):
        parsed = _Page()
        parsed.feed(html.read_text(encoding="utf-8"))
        pages[html] = parsed
    return pages


def broken_links(site: Path) -> list[str]:
    """Every internal link of the built site whose file or ``#anchor`` does not exist, as
    ``"page: link (reason)"``; links with a scheme or a host (``https:``, ``mailto:``) are not
    followed."""
    site = site.resolve()
    pages = _parse(site)
    broken = []
    for html, parsed in pages.items():
        name = html.relative_to(site).as_posix()
        for link in parsed.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc:
                continue
            target = _target(site, html, parts.path) if parts.path else html
            if not target.is_relative_to(site):
                broken.append(f"{name}: {link} (outside the site)")
            elif not target.is_file():
                broken.append(f"{name}: {link} (no file {target.relative_to(site).as_posix()})")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    broken.append(
                        f"{name}: {link} (no id {parts.fragment!r} in {target.relative_to(site).as_posix()})"
                    )
    return broken


def test_site_has_no_broken_links(site: Path) -> None:
    assert (site / "index.html").exists()
    broken = broken_links(site)
    assert not broken, f"{len(broken)} broken link(s):\n" + "\n".join(broken[:50])


def test_site_lists_render(site: Path) -> None:
    """A Markdown list needs a blank line before it; without one (common in docstrings after a
    ``**Arguments:**`` line) its items render as one paragraph with ``- `` inside."""
    found = [
        f"{html.relative_to(site).as_posix()}: {para.strip()[:80]!r}"
        for html, parsed in _parse(site).items()
        for para in parsed.paragraphs
        if re.search(r"\n\s*- \S", para)
    ]
    assert not found, "list items rendered inside a paragraph:\n" + "\n".join(found)

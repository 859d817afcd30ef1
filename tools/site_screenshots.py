"""Check the documentation site in a headless browser.

Builds the site (``mkdocs build --strict``), serves it on localhost, and opens the home page and
one API reference page in headless Chromium: the rendered DOM must carry the page's title, the
navigation and the page's own content, every request the browser made to the site must be
answered (no 404: stylesheets, scripts, images, the search index), and a screenshot of each page
is written to ``runs/site/`` (PNG, 1280x900). Exits 0 when every page passes, 1 when one does
not (saying which and why), 2 when Chromium is missing or the site does not build.

    python tools/site_screenshots.py
    python tools/site_screenshots.py --chromium /usr/bin/chromium --out runs/site

Needs Chromium (Debian: ``apt-get install chromium``) and the ``docs`` extra
(``pip install -e '.[docs]'``). The link check without a browser is ``tests/test_site.py``.
"""

from __future__ import annotations

import argparse
import functools
import html
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# --no-sandbox: runs as root in containers; the background-networking flags keep Chromium from
# opening connections of its own (on a closed network they are refused and slow it down).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=5000",
]


@dataclass(frozen=True)
class Page:
    name: str
    path: str
    title: str
    must_contain: tuple[str, ...]


PAGES = (
    Page("home", "", "timerl", ('id="timerl"', "Getting started")),
    Page(
        "reference",
        "reference/",
        "Reference - timerl",
        ('id="timerl.rt.context.Context"', 'id="reference"'),
    ),
)
# present in every page rendered by the Material theme: the navigation, and the search box its
# JavaScript fills in
COMMON = ('class="md-nav', 'data-md-component="search"')


class _Handler(SimpleHTTPRequestHandler):
    """Serves the site and records ``(status, path)`` of every request."""

    requests: list[tuple[int, str]]

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        self.requests.append((int(code) if str(code).isdigit() else 0, self.path))

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        pass


def build_site(site: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    if proc.returncode != 0:
        sys.exit(f"mkdocs build --strict failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")


def chromium(binary: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def png_problem(png: Path) -> str | None:
    """Why ``png`` is not a plausible screenshot (missing, not a PNG, one colour), or None."""
    if not png.exists():
        return "no screenshot written"
    if png.read_bytes()[:8] != b"\x89PNG\r\n\x1a\n":
        return "screenshot is not a PNG"
    try:
        from PIL import Image
    except ImportError:
        return None
    with Image.open(png) as im:
        colours = im.convert("RGB").getcolors(maxcolors=1 << 16)
    if colours is not None and len(colours) < 8:
        return f"screenshot has only {len(colours)} colour(s): a blank page"
    return None


def check_page(binary: str, base: str, page: Page, out: Path, timeout: float) -> list[str]:
    """Render ``page``; the problems found (empty when it rendered as expected)."""
    url = base + page.path
    problems = []
    dom = chromium(binary, ["--dump-dom", url], timeout)
    if dom.returncode != 0 or not dom.stdout.strip():
        return [f"chromium --dump-dom {url} failed (rc {dom.returncode}): {dom.stderr[-1000:]}"]
    m = re.search(r"<title>(.*?)</title>", dom.stdout, flags=re.S)
    title = html.unescape(m.group(1).strip()) if m else None
    if title != page.title:
        problems.append(f"title {title!r}, expected {page.title!r}")
    problems += [f"DOM lacks {s}" for s in (*COMMON, *page.must_contain) if s not in dom.stdout]
    png = out / f"{page.name}.png"
    png.unlink(missing_ok=True)
    shot = chromium(binary, [f"--screenshot={png}", "--window-size=1280,900", url], timeout)
    if shot.returncode != 0:
        problems.append(f"chromium --screenshot failed (rc {shot.returncode}): {shot.stderr[-1000:]}")
    elif problem := png_problem(png):
        problems.append(problem)
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chromium", default=None, help="Chromium binary (default: found on PATH)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "site", help="screenshot folder")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per Chromium run")
    args = ap.parse_args(argv)

    binary = args.chromium or next(
        (b for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
    )
    if binary is None or shutil.which(binary) is None:
        print(
            "error: Chromium not found (apt-get install chromium, or pass --chromium PATH)",
            file=sys.stderr,
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory(prefix="timerl-site-") as tmp:
        site = Path(tmp) / "site"
        build_site(site)
        handler = type("Handler", (_Handler,), {"requests": []})
        server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_address[1]}/"
        failed = False
        try:
            for page in PAGES:
                del handler.requests[:]
                problems = check_page(binary, base, page, args.out, args.timeout)
                problems += [f"HTTP {code} for {path}" for code, path in handler.requests if code >= 400]
                served = sum(code < 400 for code, _ in handler.requests)
                if problems:
                    failed = True
                    print(f"FAIL {page.name} ({base}{page.path}):", *problems, sep="\n  ")
                else:
                    print(
                        f"ok   {page.name}: {page.title!r}, {served} requests served, {args.out / page.name}.png"
                    )
        finally:
            server.shutdown()
            server.server_close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

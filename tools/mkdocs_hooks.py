"""MkDocs hooks (``mkdocs.yml``: ``hooks``): the docstrings use Sphinx cross-reference roles
(``:class:`Foo```); in the generated reference they render as plain code, without the role."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):(<code>)~?")


def on_page_content(html: str, **kwargs: object) -> str:
    return _ROLE.sub(r"\1", html)

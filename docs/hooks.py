"""MkDocs hook: docstrings cite code with Sphinx roles (``:class:`Plan```), which
mkdocstrings renders as Markdown; drop the role and keep the code, as Sphinx shows it."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:[\w]+\.)*([\w]+)</code>")


def on_page_content(html: str, **_: object) -> str:
    return _TILDE.sub(r"<code>\1</code>", _ROLE.sub("", html))

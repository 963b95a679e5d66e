"""MkDocs hook: show the reST roles of the docstrings as plain code on the reference pages.

The package's docstrings cross-reference with reST roles (``:class:`LLMClient```), which
Markdown renders as the role's name followed by the code. On the reference pages only,
``:class:`~a.b.C``` becomes ``C`` in code, ``:meth:`title <target>``` becomes ``title``,
and a paragraph ending in reST's ``::`` (a literal block follows) ends in ``:``.
"""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(
    r":(?:class|meth|func|mod|data|attr|exc|obj|const|py:\w+):<code>(~?)([^<]*)</code>"
)
TITLED = re.compile(r"^(.*?)\s*&lt;[^&]*&gt;$")
LITERAL_LEAD = re.compile(r"::</p>")


def _plain(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    titled = TITLED.match(target)
    if titled:
        target = titled.group(1)
    elif short:
        target = target.rsplit(".", 1)[-1]
    return f"<code>{target}</code>"


def rest_to_html(html: str) -> str:
    """The rendered page with every reST role shown as code and ``::`` leads as ``:``."""
    return LITERAL_LEAD.sub(":</p>", ROLE.sub(_plain, html))


def on_page_content(html: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: rewrite the reference pages, leave the others as written."""
    if page.file.src_uri.startswith("reference/"):
        return rest_to_html(html)
    return html

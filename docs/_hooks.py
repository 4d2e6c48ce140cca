"""mkdocs hooks of the docs site (mkdocs.yml ``hooks:``): doctest sessions shown as code.

The guides and the docstrings hold doctest sessions as plain paragraphs
(``>>>`` lines and their output, which the test suite runs). Markdown would
read them as text and take ``['hi']`` for a link; the page hook, and the
griffe extension :class:`DoctestFences` for the docstrings of the API
reference, fence each session as ``pycon`` code before it is rendered. The
source files stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_FENCE = re.compile(r"^\s*(```|~~~)")
# A Sphinx role as the docstrings write it (:class:`raf.Agent`), once rendered to HTML.
_ROLE = re.compile(r":(?:class|func|meth|attr|data|exc|mod|obj):<code>~?([\w.]+)(\(\))?</code>")


def fence_doctests(markdown: str) -> str:
    r"""Each run of lines from a ``>>>`` line to the next blank line, fenced as pycon.

    >>> fence_doctests("Text.\n\n>>> 1 + 1\n2\n\nMore.").splitlines()
    ['Text.', '', '```pycon', '>>> 1 + 1', '2', '```', '', 'More.']
    """
    out: list[str] = []
    in_fence = in_session = False
    for line in markdown.split("\n"):
        if in_session and not line.strip():
            out.append("```")
            in_session = False
        elif not in_session and not in_fence and line.startswith(">>>"):
            out.append("```pycon")
            in_session = True
        elif not in_session and _FENCE.match(line):
            in_fence = not in_fence
        out.append(line)
    if in_session:
        out.append("```")
    return "\n".join(out)


def link_roles(html: str) -> str:
    """The docstrings' Sphinx roles as code, linked to the name's entry on the page if it
    has one (``raf.X`` or ``X`` alike).

    >>> print(link_roles('<h2 id="raf.Agent">:class:<code>Agent</code>, :func:<code>f()</code>'))
    <h2 id="raf.Agent"><a href="#raf.Agent"><code>Agent</code></a>, <code>f()</code>
    """
    ids = set(re.findall(r'id="([\w.]+)"', html))

    def link(match: re.Match[str]) -> str:
        name, call = match.group(1), match.group(2) or ""
        code = f"<code>{name}{call}</code>"
        for target in (name, f"raf.{name}"):
            if target in ids:
                return f'<a href="#{target}">{code}</a>'
        return code

    return _ROLE.sub(link, html)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    return fence_doctests(markdown)


def on_page_content(html: str, **kwargs: Any) -> str:
    return link_roles(html)


class DoctestFences(griffe.Extension):
    """A griffe extension (mkdocstrings' ``extensions:``): docstrings' doctests fenced."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_doctests(obj.docstring.value)

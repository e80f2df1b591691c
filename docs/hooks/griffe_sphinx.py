"""A Griffe extension that reads Sphinx's attribute docstrings, for the API reference.

``#:`` comments above an attribute (a module constant, a field of an attrs
class) become the attribute's docstring, unless it has one already:
mkdocstrings would otherwise show the attribute without its meaning.
Cross-references in docstrings are written in mkdocstrings' own syntax
(``[`MalformedRequest`][pd_policy.errors.MalformedRequest]``), which a
strict build resolves or refuses; a test keeps Sphinx roles from coming back.

Loaded by mkdocstrings (``extensions:`` in ``mkdocs.yml``), by path.
"""

from __future__ import annotations

from typing import Any

import griffe

__all__ = ["SphinxComments"]


def _comment_docstring(attr: griffe.Attribute) -> str | None:
    """The ``#:`` comment lines right above ``attr``'s first line, joined, or ``None``."""
    if attr.lineno is None:
        return None
    try:
        lines = attr.module.lines
    except (AttributeError, ValueError):
        return None
    found: list[str] = []
    index = attr.lineno - 2
    while index >= 0 and lines[index].lstrip().startswith("#:"):
        found.append(lines[index].lstrip()[2:].strip())
        index -= 1
    return "\n".join(reversed(found)) if found else None


class SphinxComments(griffe.Extension):
    """Reads ``#:`` attribute comments as attribute docstrings."""

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        """Give an attribute without a docstring the ``#:`` comment above it."""
        if attr.docstring is None and (text := _comment_docstring(attr)):
            attr.docstring = griffe.Docstring(text, lineno=attr.lineno, parent=attr)

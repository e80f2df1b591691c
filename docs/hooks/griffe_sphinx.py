"""A Griffe extension that reads the two Sphinx habits of this code base, for the API reference.

The docstrings are Sphinx-style (``docstring_style: sphinx`` parses their
``:param:`` and ``:raises:`` fields), but mkdocstrings renders neither of
these, which it would otherwise show as they are written:

* ``#:`` comments above an attribute, Sphinx's attribute docstrings, become
  the attribute's docstring (unless it has one already);
* cross-reference roles in prose (``:class:`~pd_policy.errors.MalformedRequest```,
  ``:func:`plan```, ``:attr:`WorkerCapability.accepts_mm_metadata```) become
  links to the object's entry in the reference. A name is resolved in the
  scope of the docstring that uses it; ``~`` shows the last component only,
  ``title <target>`` shows the title, and ``!`` asks for no link. The link is
  an *optional* autorefs reference: a target that has no entry (not
  documented, or outside the project) is shown as code without a link,
  instead of failing the strict build.

Loaded by mkdocstrings (``extensions:`` in ``mkdocs.yml``), by path.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

__all__ = ["SphinxComments", "sphinx_roles_to_autorefs"]

_ROLE = re.compile(
    r":(?:py:)?(?P<role>class|func|meth|attr|data|exc|mod|obj|const|type):`(?P<body>[^`]+)`"
)
_TITLED = re.compile(r"^(?P<title>.+?)\s*<(?P<target>[^<>]+)>$")


def _resolve(target: str, scope: griffe.Object | None) -> str:
    """The canonical path of ``target`` as seen from ``scope`` (``target`` if unknown).

    Canonical, because the reference has an entry under the path where an object
    is defined (``pd_policy.salt.decode_cache_salt``), not where it is re-exported
    (``pd_policy.decode_cache_salt``).
    """
    if scope is None:
        return target
    head, _, rest = target.partition(".")
    try:
        full = scope.resolve(head)
    except (griffe.NameResolutionError, AttributeError, KeyError, ValueError):
        full = head
    full = f"{full}.{rest}" if rest else full
    try:
        canonical: str = scope.modules_collection[full].canonical_path
    except (griffe.AliasResolutionError, griffe.CyclicAliasError, KeyError, ValueError):
        return full
    return canonical


def sphinx_roles_to_autorefs(text: str, scope: griffe.Object | None = None) -> str:
    """``text`` with each Sphinx cross-reference role replaced by an optional autorefs link.

    Text outside the roles is returned unchanged.
    """

    def replace(m: re.Match[str]) -> str:
        body = m["body"].strip()
        if titled := _TITLED.match(body):
            title, target = titled["title"], titled["target"].strip()
        else:
            target = body.lstrip("~!")
            title = target.rsplit(".", 1)[-1] if body.startswith("~") else target
        if body.startswith("!"):
            return f"<code>{html.escape(title)}</code>"
        target = target.lstrip("~.")
        identifier = html.escape(_resolve(target, scope), quote=True)
        return (
            f'<autoref identifier="{identifier}" optional>'
            f"<code>{html.escape(title)}</code></autoref>"
        )

    return _ROLE.sub(replace, text)


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


def _rewrite(obj: griffe.Object, seen: set[str]) -> None:
    if obj.path in seen:
        return
    seen.add(obj.path)
    if obj.docstring is not None:
        obj.docstring.value = sphinx_roles_to_autorefs(obj.docstring.value, obj)
    for member in list(obj.members.values()):
        if not member.is_alias and isinstance(member, griffe.Object):
            _rewrite(member, seen)


class SphinxComments(griffe.Extension):
    """Reads ``#:`` attribute comments and turns Sphinx roles into reference links."""

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        """Give an attribute without a docstring the ``#:`` comment above it."""
        if attr.docstring is None and (text := _comment_docstring(attr)):
            attr.docstring = griffe.Docstring(text, lineno=attr.lineno, parent=attr)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite the roles once the package is loaded, when names can be resolved."""
        _rewrite(pkg, set())

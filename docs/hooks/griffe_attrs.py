"""A Griffe extension that gives ``attrs`` classes their constructor, for the API reference.

Griffe reads the source without running it, and knows the ``__init__`` that
``@dataclass`` writes but not the one that ``@attrs.frozen`` / ``@attrs.define``
write, so without this the reference would show ``Request`` with no
parameters and each field as ``attrs.field(default=None, converter=...)``.

For each class decorated with ``attrs.frozen``, ``attrs.define``,
``attrs.mutable`` or the ``attr`` spellings, and that defines no ``__init__``
itself, it:

* adds an ``__init__`` whose parameters are the fields in attrs' order (the
  fields of attrs base classes first), each with its annotation and default
  (``default=``, or ``factory=F`` shown as ``F()``), keyword-only where
  ``kw_only`` says so, under its ``alias`` (a private field's name loses its
  leading underscores, as in attrs), and without the fields with
  ``init=False``;
* shows each field as an instance attribute whose value is its default (or
  none), instead of the ``attrs.field(...)`` call.

``ClassVar`` attributes, properties and unannotated names are not fields.
Loaded by mkdocstrings (``extensions:`` in ``mkdocs.yml``), by path.
"""

from __future__ import annotations

from typing import Any

import griffe

__all__ = ["AttrsFields"]

_DECORATORS = frozenset(
    {
        "attrs.frozen", "attrs.define", "attrs.mutable",
        "attr.frozen", "attr.define", "attr.mutable", "attr.s", "attr.attrs", "attr.dataclass",
    }
)  # fmt: skip
_FIELD_CALLS = frozenset({"attrs.field", "attr.ib", "attr.attrib", "attr.field"})
_FACTORY_CALLS = frozenset({"attrs.Factory", "attr.Factory"})


def _attrs_decorator(cls: griffe.Class) -> griffe.Decorator | None:
    for decorator in cls.decorators:
        value = decorator.value
        if isinstance(value, griffe.Expr) and value.canonical_path in _DECORATORS:
            return decorator
    return None


def _keywords(expr: object) -> dict[str, str | griffe.Expr]:
    """The keyword arguments of a call expression (nothing for anything else)."""
    if not isinstance(expr, griffe.ExprCall):
        return {}
    return {arg.name: arg.value for arg in expr.arguments if isinstance(arg, griffe.ExprKeyword)}


def _is_true(value: object) -> bool:
    return str(value) == "True"


def _factory_default(factory: str | griffe.Expr) -> str | griffe.Expr:
    """``factory=F`` shown as ``F()``; a lambda or other expression as ``<factory>``."""
    if isinstance(factory, griffe.ExprName | griffe.ExprAttribute):
        return griffe.ExprCall(factory, [])
    return "<factory>"


def _field_default(value: str | griffe.Expr | None) -> tuple[bool, str | griffe.Expr | None]:
    """Whether an attribute's value gives its field a default, and which."""
    if value is None:
        return False, None
    if isinstance(value, griffe.ExprCall) and value.canonical_path in _FIELD_CALLS:
        kwargs = _keywords(value)
        positional = [a for a in value.arguments if not isinstance(a, griffe.ExprKeyword)]
        if "default" in kwargs:
            default = kwargs["default"]
            if isinstance(default, griffe.ExprCall) and default.canonical_path in _FACTORY_CALLS:
                return True, _factory_default(default.arguments[0])
            return True, default
        if "factory" in kwargs:
            return True, _factory_default(kwargs["factory"])
        if value.canonical_path.startswith("attr.") and positional:
            # attr.ib's first positional argument is its default.
            return True, positional[0]
        return False, None
    if isinstance(value, griffe.ExprCall) and value.canonical_path in _FACTORY_CALLS:
        return True, _factory_default(value.arguments[0])
    return True, value


def _fields(cls: griffe.Class) -> list[griffe.Attribute]:
    fields = []
    for member in cls.members.values():
        if member.is_alias or not isinstance(member, griffe.Attribute):
            continue
        if member.annotation is None or "property" in member.labels:
            continue
        # Griffe labels a ClassVar as a class attribute only; a field is both.
        if "instance-attribute" not in member.labels:
            continue
        fields.append(member)
    return fields


def _parameters(cls: griffe.Class, class_kw_only: bool) -> list[griffe.Parameter]:
    params = []
    for field in _fields(cls):
        value = field.value
        is_field = isinstance(value, griffe.ExprCall) and value.canonical_path in _FIELD_CALLS
        kwargs = _keywords(value) if is_field else {}
        if "init" in kwargs and not _is_true(kwargs["init"]):
            continue
        has_default, default = _field_default(field.value)
        alias = kwargs.get("alias")
        name = str(alias).strip("'\"") if alias is not None else field.name.lstrip("_")
        kw_only = class_kw_only or _is_true(kwargs.get("kw_only"))
        params.append(
            griffe.Parameter(
                name,
                annotation=field.annotation,
                kind=griffe.ParameterKind.keyword_only
                if kw_only
                else griffe.ParameterKind.positional_or_keyword,
                default=default if has_default else None,
                docstring=field.docstring,
            )
        )
        # Shown as what an instance holds: attrs moves fields off the class.
        field.labels.discard("class-attribute")
        field.value = default if has_default else None
    return params


def _own(cls: griffe.Class, own: dict[str, list[griffe.Parameter]]) -> list[griffe.Parameter]:
    """The parameters of the fields ``cls`` defines itself (none for a non-attrs class).

    Computed once per class: it rewrites the fields' values as it goes.
    """
    if cls.path not in own:
        decorator = _attrs_decorator(cls)
        kw_only = decorator is not None and _is_true(_keywords(decorator.value).get("kw_only"))
        own[cls.path] = [] if decorator is None else _parameters(cls, kw_only)
    return own[cls.path]


def _add_init(cls: griffe.Class, own: dict[str, list[griffe.Parameter]]) -> None:
    """Give an attrs class without an ``__init__`` one: its bases' fields first, as attrs."""
    if _attrs_decorator(cls) is None:
        return
    try:
        bases = [b for b in reversed(cls.mro()) if _attrs_decorator(b) is not None]
    except ValueError:
        bases = []
    by_name: dict[str, griffe.Parameter] = {}
    for klass in [*bases, cls]:
        for param in _own(klass, own):
            # A field redefined in a subclass takes the subclass's definition and place.
            by_name.pop(param.name, None)
            by_name[param.name] = param
    # attrs puts keyword-only parameters last.
    params = sorted(by_name.values(), key=lambda p: p.kind is griffe.ParameterKind.keyword_only)
    if "__init__" not in cls.members:
        self_param = griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)
        init = griffe.Function(
            "__init__",
            lineno=cls.lineno,
            endlineno=cls.lineno,
            parent=cls,
            parameters=griffe.Parameters(self_param, *params),
            returns="None",
        )
        cls.set_member("__init__", init)


def _walk(obj: griffe.Module | griffe.Class, own: dict[str, list[griffe.Parameter]]) -> None:
    if isinstance(obj, griffe.Class):
        _add_init(obj, own)
    for member in list(obj.members.values()):
        if not member.is_alias and isinstance(member, griffe.Module | griffe.Class):
            _walk(member, own)


class AttrsFields(griffe.Extension):
    """Adds the constructor of every ``attrs`` class of a loaded package."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Run once a whole package is loaded, when base classes can be resolved."""
        _walk(pkg, {})

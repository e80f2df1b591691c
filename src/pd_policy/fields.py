"""Field checks for the core's frozen types: a typed 400 naming the field, never its value.

Every constructor refuses an ill-typed field with
[`MalformedRequest`][pd_policy.errors.MalformedRequest] whose ``param`` is the field's name
and whose message names the expected and the received *type*: a value may be a
salt, a URL or a host, and an error is returned to clients.

Integers that travel on the SMG wire (token ids, ``n``, placeholder offsets and
lengths, shape dimensions, image token ids) are ``uint32`` there, so they are
bounded to what the wire can carry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs

from .errors import MalformedRequest, PolicyError

__all__ = ["UINT32_MAX", "count_repr", "instance_of", "redacted_repr", "uint32"]

#: The largest value of a ``uint32`` wire field.
UINT32_MAX: Final = 2**32 - 1

_Check = Callable[[object, "attrs.Attribute[Any]", Any], None]


def instance_of(
    kind: type | tuple[type, ...],
    *,
    optional: bool = False,
    error: type[PolicyError] = MalformedRequest,
) -> _Check:
    """A validator: the value is a ``kind`` (or ``None`` when ``optional``); a ``bool`` is
    never taken for an ``int``. Raises ``error`` (a router's configuration raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration])."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    expected = " or ".join(k.__name__ for k in kinds) + (" or None" if optional else "")

    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            raise error(f"{attr.name} must be {expected}, not {type(value).__name__}", attr.name)

    return check


def uint32(*, optional: bool = False, minimum: int = 0) -> _Check:
    """A validator: an ``int`` (not a ``bool``) in ``minimum..UINT32_MAX``."""

    def check(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is None and optional:
            return
        if type(value) is not int or not minimum <= value <= UINT32_MAX:
            raise MalformedRequest(
                f"{attr.name} must be an integer in {minimum}..{UINT32_MAX}", param=attr.name
            )

    return check


def redacted_repr(value: object) -> str:
    """The ``repr`` of a field that may carry a secret or an address: only whether it is
    set."""
    return "None" if value is None else "<redacted>"


def count_repr(value: tuple[object, ...]) -> str:
    """The ``repr`` of identities (content hashes): how many, not which."""
    return f"<{len(value)}>"

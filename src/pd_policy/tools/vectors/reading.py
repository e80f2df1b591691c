"""Reading a case's fields: a missing or ill-typed field is the document's fault, a typed 400
naming it; a policy error the case is about is its outcome, as data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypeVar, cast

from pd_policy.errors import MalformedRequest, PolicyError

__all__ = ["error", "field", "opt_field"]

T = TypeVar("T")
_MISSING: Final = object()
_KINDS: Final = {
    dict: "an object",
    list: "a list",
    str: "a string",
    int: "an integer",
    bool: "a boolean",
}


def error(exc: PolicyError) -> dict[str, Any]:
    return {"status": exc.status, "error_code": exc.code, "error_param": exc.param}


def field(case: Mapping[str, Any], key: str, kind: type[T], *, default: Any = _MISSING) -> T:
    """``case[key]``, a ``kind``; a missing or ill-typed field is the document's fault."""
    if key not in case:
        if default is _MISSING:
            raise MalformedRequest("missing required field", param=key)
        return cast(T, default)
    value = case[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise MalformedRequest(f"must be {_KINDS.get(kind, kind.__name__)}", param=key)
    return value


def opt_field(case: Mapping[str, Any], key: str, kind: type[T]) -> T | None:
    return None if case.get(key) is None else field(case, key, kind)

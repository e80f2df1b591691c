"""Reading JSON documents strictly: typed fields, named by their path.

The codec's building blocks: each reader checks one value's type and raises
[`MalformedRequest`][pd_policy.errors.MalformedRequest] whose ``param`` is the
field's path (``batches[0].tensors.image_grid_thw.shape``), and whose message says
what was expected, never what was found.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

from .errors import MalformedRequest

# The readers are the codec's own, underscored: none is part of the API.
__all__: list[str] = []

T = TypeVar("T")

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    bool: "a boolean",
    list: "a list",
    dict: "an object",
}


def _fail(path: str, message: str) -> MalformedRequest:
    return MalformedRequest(f"{path or 'the document'}: {message}", param=path or None)


#: A key a path names as it is; any other (a document's own keys: tensor names, unknown
#: fields) is quoted, so that a path stays one short line of ASCII whatever the key holds.
_PLAIN_KEY: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_QUOTED_CHARS: Final = 40


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN_KEY.fullmatch(key):
        cut = key[:_QUOTED_CHARS] + ("..." if len(key) > _QUOTED_CHARS else "")
        key = json.dumps(cut)  # ASCII, control characters escaped
    return f"{path}.{key}" if path else key


def _expect(value: object, kind: type[T], path: str) -> T:
    # bool is an int subclass; JSON true is never a token id or a count.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _fail(path, f"expected {_TYPE_NAMES.get(kind, kind.__name__)}")
    return value


def _obj(
    value: object, path: str, required: frozenset[str], optional: frozenset[str]
) -> dict[str, Any]:
    obj = _expect(value, dict, path)
    for key in obj:
        if not isinstance(key, str) or key not in required | optional:
            raise _fail(_join(path, str(key)), "unknown field")
    for key in sorted(required):
        if key not in obj:
            raise _fail(_join(path, key), "missing required field")
    return obj


def _list(value: object, path: str, item: Callable[[object, str], T]) -> list[T]:
    return [item(v, _join(path, i)) for i, v in enumerate(_expect(value, list, path))]


def _opt(obj: Mapping[str, Any], key: str, path: str, read: Callable[[object, str], T]) -> T | None:
    value = obj.get(key)
    return None if value is None else read(value, _join(path, key))


def _str(v: object, p: str) -> str:
    return _expect(v, str, p)


def _int(v: object, p: str) -> int:
    return _expect(v, int, p)


def _build(path: str, make: Callable[[], T]) -> T:
    """Run a constructor, re-rooting its error's ``param`` at ``path``."""
    try:
        return make()
    except MalformedRequest as exc:
        # ``exc.param`` is a path already (``placeholders[0].offset``): joined, not quoted.
        param = (f"{path}.{exc.param}" if path else exc.param) if exc.param else path
        raise MalformedRequest(exc.message, param=param or None) from None


def _enum(kind: type[Any], value: object, path: str) -> Any:
    text = _str(value, path)
    try:
        return kind(text)
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise _fail(path, f"expected one of {allowed}") from None

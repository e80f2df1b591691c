"""Strict JSON text: what the policy reads as JSON, it reads one way.

The standard library takes the last of two equal keys, ``NaN`` and
``Infinity``, and fails with a ``RecursionError`` on deep nesting. A document
that two readers could take differently (a gateway that keeps the first key, an
engine that keeps the last) is refused instead, with
[`MalformedRequest`][pd_policy.errors.MalformedRequest] whose message gives the position and
never the content: JSON here carries KV parameters, hosts and salts.
"""

from __future__ import annotations

import json
import math
from typing import Any

from .errors import MalformedRequest

__all__ = ["loads_strict"]


class _Duplicate(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Duplicate("an object names one key twice")
    return dict(pairs)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("a number out of a double's range")
    return value


_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique, parse_constant=_no_constant, parse_float=_finite
)


def loads_strict(text: str | bytes, *, what: str = "the document", param: str = "") -> Any:
    """Parse ``text`` (UTF-8 when bytes) as strict JSON.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (``param`` as given) naming
    ``what`` for text that is not UTF-8 or not JSON, an object with a key twice,
    ``NaN``, ``Infinity`` or a number beyond a double's range, and nesting deeper
    than the interpreter can follow.
    """
    try:
        source = text.decode("utf-8") if isinstance(text, bytes) else text
        return _DECODER.decode(source)
    except _Duplicate:
        raise MalformedRequest(f"{what}: an object names one key twice", param or None) from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise MalformedRequest(f"{what} is not JSON ({exc.msg}, {where})", param or None) from None
    except UnicodeDecodeError:
        raise MalformedRequest(f"{what} is not UTF-8 text", param or None) from None
    except RecursionError:
        raise MalformedRequest(f"{what} is nested too deeply", param or None) from None
    except ValueError:
        raise MalformedRequest(
            f"{what} holds NaN, Infinity or a number out of range", param or None
        ) from None

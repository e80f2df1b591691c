"""The conformance operations of what a client may send: the fields only a router may set,
and the cap on a request's media items.

* ``client_fields``: what a router does with a client's ``body`` (any JSON): the router's
  fields it drops (``dropped``, their dotted names in the table's order), or the refusal
  of the first it refuses;
* ``media_items``: whether a request of ``count`` media items (or, ``of: "parts"``,
  messages and content parts together) passes the cap ``limit``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pd_policy.errors import PolicyError
from pd_policy.request_bounds import check_media_items, check_parts
from pd_policy.router_fields import check_client_fields

from .reading import error, field

__all__ = ["CLIENT_OPERATIONS"]


def _fields_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    if "body" not in case:
        field(case, "body", object)  # raises: the field is required
    try:
        dropped = check_client_fields(case["body"])
    except PolicyError as exc:
        return error(exc)
    return {"status": 200, "dropped": [f.name for f in dropped]}


def _items_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    check = check_parts if field(case, "of", str, default="media") == "parts" else check_media_items
    try:
        check(field(case, "count", int), field(case, "limit", int))
    except PolicyError as exc:
        return error(exc)
    return {"status": 200}


#: The client operations, by name.
CLIENT_OPERATIONS: Final = {
    "client_fields": _fields_outcome,
    "media_items": _items_outcome,
}

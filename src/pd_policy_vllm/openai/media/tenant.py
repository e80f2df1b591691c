"""A request body's client uuids, scoped to the request's tenant before any leg is built.

The rule is the core's ([`pd_policy.media.uuid_scope`][pd_policy.media.uuid_scope]); this
module binds it to an HTTP request: the tenant is the body's ``cache_salt`` and the bearer
key the proxy admitted, and every content part's ``uuid`` is replaced by its forwarded
name.
It runs once, on the body every later step reads (the fleet's choice, the identities,
the prefill, render and decode legs), so no leg can carry a uuid as the client sent it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, Final

from pd_policy import ClientUuids, Tenant, forwarded_uuid

__all__ = ["bearer", "request_tenant", "scope_uuids", "scoped_body"]

#: The members of a body whose items hold content parts: chat's and the Responses API's.
_ITEMS: Final = ("messages", "input")
_BEARER: Final = "bearer "


def bearer(authorization: str | None) -> str | None:
    """The key an ``Authorization: Bearer`` header presents; ``None`` for another scheme
    or no header."""
    if not authorization or authorization[: len(_BEARER)].lower() != _BEARER:
        return None
    return authorization[len(_BEARER) :].strip()


def request_tenant(body: Mapping[str, Any], authorization: str | None, *, keyed: bool) -> Tenant:
    """The tenant of a request whose body is ``body`` and whose ``Authorization`` header
    is ``authorization``: its ``cache_salt`` when it is a string, and its bearer key when
    the proxy checks keys (``keyed``: the key is then one the proxy admitted; a proxy that
    takes any client takes any bearer too, which names no one)."""
    salt = body.get("cache_salt")
    key = bearer(authorization) if keyed else None
    return Tenant.of(cache_salt=salt if isinstance(salt, str) else None, api_key=key)


def _scoped_content(
    content: list[Any], tenant: Callable[[], Tenant], mode: ClientUuids
) -> list[Any] | None:
    out: list[Any] | None = None
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("uuid") is None:
            continue
        if out is None:
            out = list(content)
        # vLLM reads a uuid with str(); every part's, whatever its type: none is passed on.
        out[index] = {**part, "uuid": forwarded_uuid(str(part["uuid"]), tenant(), mode)}
    return out


def _scoped_items(
    items: list[Any], tenant: Callable[[], Tenant], mode: ClientUuids
) -> list[Any] | None:
    out: list[Any] | None = None
    for index, item in enumerate(items):
        content = item.get("content") if isinstance(item, dict) else None
        scoped = _scoped_content(content, tenant, mode) if isinstance(content, list) else None
        if scoped is None:
            continue
        if out is None:
            out = list(items)
        out[index] = {**item, "content": scoped}
    return out


def scope_uuids(
    body: Any, tenant: Tenant | Callable[[], Tenant], mode: ClientUuids = ClientUuids.SCOPED
) -> Any:
    """``body`` with the ``uuid`` of every content part of its ``messages`` (a chat body)
    and of its ``input`` items (a Responses body, whose own request is a decode leg)
    replaced by [`forwarded_uuid`][pd_policy.media.uuid_scope.forwarded_uuid] for ``tenant``:
    a new body sharing every other value (``body`` is not changed), or ``body`` itself
    when no part has a uuid or ``mode`` trusts them. A body of another shape is returned
    as it is: the plan refuses it. ``tenant`` may be a function giving it, called only
    when a part has a uuid."""
    if mode is ClientUuids.TRUSTED or not isinstance(body, dict):
        return body
    given = tenant
    get: Callable[[], Tenant] = (lambda: given) if isinstance(given, Tenant) else given
    out = body
    for field in _ITEMS:
        items = body.get(field)
        scoped = _scoped_items(items, get, mode) if isinstance(items, list) else None
        if scoped is not None:
            out = {**out, field: scoped}
    return out


def scoped_body(
    body: Any, raw: bytes, authorization: str | None, *, keyed: bool, mode: ClientUuids
) -> tuple[Any, bytes | None]:
    """``body`` with its uuids scoped to its tenant
    ([`request_tenant`][pd_policy_vllm.openai.media.tenant.request_tenant], with ``keyed`` when
    the proxy checks clients' keys;
    [`scope_uuids`][pd_policy_vllm.openai.media.tenant.scope_uuids]),
    and the client's bytes ``raw`` that a prefill leg may be spliced from: ``None`` once
    a uuid was replaced, since those bytes hold the client's uuids. A body with no uuid
    (a completions body, one that is not an object) is returned as it is, with ``raw``."""
    if not isinstance(body, dict) or mode is ClientUuids.TRUSTED:
        return body, raw
    # The tenant's digests only for a body that has a uuid: most have none.
    tenant = functools.cache(lambda: request_tenant(body, authorization, keyed=keyed))
    scoped = scope_uuids(body, tenant, mode)
    return (body, raw) if scoped is body else (scoped, None)

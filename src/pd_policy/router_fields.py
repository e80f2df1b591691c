"""The request fields only a router may set, and what becomes of them when a client sends one.

A P/D router owns the KV handoff: it tags the prefill leg for it and hands the decode leg
what the prefill returned, checked. vLLM takes the same fields from anyone who sends them:
a client's ``kv_transfer_params`` on a leg that carries none of the router's (a decode that
runs alone for ``n>1``, a prefill in passthrough, a prefill that returned nothing) would
tell a worker to connect where the client says and read the blocks it names. vLLM also
reads the handoff from the extension arguments (``vllm_xargs``) when the body sets none.
So each field here is refused from a client, on every route and decode form, before any
worker is called (a typed 400, [`RouterOwnedField`][pd_policy.client_errors.RouterOwnedField]);
the few that vLLM's own clients legitimately send, and that the router replaces with its
own, are dropped (the caller logs it).

The names are those of vLLM's OpenAI-compatible bodies (chat, completions, responses); an
adapter on another wire maps each to its own fields. The table in ``docs/security.md`` is
generated from [`ROUTER_FIELDS`][pd_policy.router_fields.ROUTER_FIELDS].
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

import attrs

from .client_errors import RouterOwnedField

__all__ = [
    "ROUTER_FIELDS",
    "OnClient",
    "RouterField",
    "check_client_fields",
    "router_fields_in",
    "without_dropped",
]


class OnClient(enum.Enum):
    """What becomes of a router's field that a client sent."""

    #: A typed 400 naming the field: nothing is forwarded.
    REFUSE = "refuse"
    #: Dropped (and logged by the caller): the router sets its own.
    DROP = "drop"


@attrs.frozen(slots=True)
class RouterField:
    """A field only the router may set: where it is in a body (``path``: a top-level key,
    or a key inside a top-level object), what becomes of it from a client, and why the
    router owns it."""

    path: tuple[str, ...]
    on_client: OnClient
    why: str

    @property
    def name(self) -> str:
        """The field's dotted name, as an error's ``param`` gives it."""
        return ".".join(self.path)


_HANDOFF: Final = (
    "the KV handoff: the router tags the prefill for it and relays what the prefill returned "
    "to the decode; a client's would tell a worker where to connect and which blocks to read"
)
_EC: Final = (
    "the encoder cache's handoff in E/P/D: which encoder outputs a prefill loads, and from where"
)

#: Every field only the router may set.
ROUTER_FIELDS: Final = (
    RouterField(("kv_transfer_params",), OnClient.REFUSE, _HANDOFF),
    RouterField(("ec_transfer_params",), OnClient.REFUSE, _EC),
    RouterField(
        ("vllm_xargs", "kv_transfer_params"),
        OnClient.REFUSE,
        "vLLM reads the KV handoff from the extension arguments when the body sets none",
    ),
    RouterField(
        ("vllm_xargs", "ec_transfer_params"),
        OnClient.REFUSE,
        "vLLM reads the encoder cache's handoff from the extension arguments too",
    ),
    RouterField(
        ("vllm_xargs", "kv_cache_report_mode"),
        OnClient.REFUSE,
        "makes a worker publish every block of a request as a KV event again, which the "
        "router's prefix index follows",
    ),
    RouterField(
        ("request_id",),
        OnClient.DROP,
        "the id the engine runs a request under: the router's own, unique per request, so "
        "that two clients' ids never collide on one engine; vLLM's clients may send one",
    ),
)


def _present(body: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    holder: Any = body
    for key in path[:-1]:
        holder = holder.get(key)
        if not isinstance(holder, Mapping):
            return False
    return path[-1] in holder


#: The top-level keys under which a router's field may be: a body with none of them (nearly
#: every body) is checked by one set operation.
_HOLDERS: Final = frozenset(field.path[0] for field in ROUTER_FIELDS)


def router_fields_in(body: Any) -> tuple[RouterField, ...]:
    """The router's fields that ``body`` sets, whatever their value (``null`` included), in
    the order of [`ROUTER_FIELDS`][pd_policy.router_fields.ROUTER_FIELDS]; ``()`` for a body
    that is not an object."""
    if not isinstance(body, Mapping) or _HOLDERS.isdisjoint(body.keys()):
        return ()
    return tuple(field for field in ROUTER_FIELDS if _present(body, field.path))


def check_client_fields(body: Any) -> tuple[RouterField, ...]:
    """Check a client's ``body`` for the router's fields: the ones to drop (the caller drops
    them, [`without_dropped`][pd_policy.router_fields.without_dropped], and logs it).

    Raises [`RouterOwnedField`][pd_policy.client_errors.RouterOwnedField] (400, ``param``
    the field's dotted name, its value never echoed) for the first field that is refused.
    """
    found = router_fields_in(body)
    for field in found:
        if field.on_client is OnClient.REFUSE:
            raise RouterOwnedField(
                f"{field.name} is set by the router, never by a client: remove it",
                param=field.name,
            )
    return found


def without_dropped(body: Mapping[str, Any], fields: tuple[RouterField, ...]) -> dict[str, Any]:
    """``body`` without the top-level ``fields`` (a new dict; ``body`` is not changed)."""
    dropped = {field.path[0] for field in fields if len(field.path) == 1}
    return {key: value for key, value in body.items() if key not in dropped}

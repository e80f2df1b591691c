"""The fields only a router may set, on the wire of SMG's vLLM engine protos.

The core names them once, by their OpenAI names
([`ROUTER_FIELDS`][pd_policy.router_fields.ROUTER_FIELDS]); on this wire each is carried by
the ``GenerateRequest`` fields [`WIRE_FIELDS`][pd_policy_grpc.owned.WIRE_FIELDS] maps it to,
in this one place, keyed by the core's own field (a core field without a row here fails a
test, and so does a proto field that looks like a handoff but has no row):

* the KV handoff (``kv_transfer_params``) is ``kv_transfer_params_json`` and the legacy
  typed ``kv_transfer_params``: refused from a caller whatever its value, an empty text
  included (set is set);
* the encoder cache's handoff and the extension arguments have no field on this wire (its
  ``GenerateRequest`` has neither, and its routers build no encode leg): nothing to refuse;
* ``request_id`` is dropped: every leg runs under the router's own id
  ([`router_request_id`][pd_policy_grpc.owned.router_request_id]), and the caller's is
  kept for the caller's logs.

The check on a message reads presence only; on bytes it reads the top-level field numbers
the reader walked, whatever their wire type, so that no form of the field a runtime could
read reaches a worker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from pd_policy import ROUTER_FIELDS, OnClient, RouterField, RouterOwnedField

from .wire import pb

__all__ = [
    "DROPPED",
    "REFUSED",
    "WIRE_FIELDS",
    "WireFields",
    "check_message",
    "check_numbers",
    "router_request_id",
]

_CORE: Final = {field.name: field for field in ROUTER_FIELDS}
_REQUEST: Final = pb.GenerateRequest.DESCRIPTOR.fields_by_name


@attrs.frozen(slots=True)
class WireFields:
    """The ``GenerateRequest`` fields that carry one of the core's router fields (``()``:
    this wire has none), and why."""

    names: tuple[str, ...]
    why: str


_NO_EXTENSION_ARGS: Final = "GenerateRequest has no extension arguments (vllm_xargs)"

#: Each core router field, as this wire carries it.
WIRE_FIELDS: Final[Mapping[RouterField, WireFields]] = {
    _CORE["kv_transfer_params"]: WireFields(
        ("kv_transfer_params_json", "kv_transfer_params"),
        "the JSON text the engine passes to its connector, and the legacy host and port",
    ),
    _CORE["ec_transfer_params"]: WireFields(
        (), "GenerateRequest has no encoder-cache field: SMG's protos carry no E/P/D"
    ),
    _CORE["vllm_xargs.kv_transfer_params"]: WireFields((), _NO_EXTENSION_ARGS),
    _CORE["vllm_xargs.ec_transfer_params"]: WireFields((), _NO_EXTENSION_ARGS),
    _CORE["vllm_xargs.kv_cache_report_mode"]: WireFields((), _NO_EXTENSION_ARGS),
    _CORE["request_id"]: WireFields(
        ("request_id",), "the id the engine runs the leg under, and aborts it by"
    ),
}


def _of(on_client: OnClient) -> tuple[tuple[str, int], ...]:
    return tuple(
        (name, _REQUEST[name].number)
        for field, wire in WIRE_FIELDS.items()
        if field.on_client is on_client
        for name in wire.names
    )


#: The wire fields refused from a caller: ``(name, number)``.
REFUSED: Final = _of(OnClient.REFUSE)
#: The wire fields the router replaces with its own: ``(name, number)``.
DROPPED: Final = _of(OnClient.DROP)
_REFUSED_BY_NUMBER: Final = {number: name for name, number in REFUSED}


def _refuse(name: str) -> RouterOwnedField:
    return RouterOwnedField(
        f"{name} is set by the router, never by a client: remove it", param=name
    )


def check_message(request: pb.GenerateRequest) -> None:
    """Raise [`RouterOwnedField`][pd_policy.client_errors.RouterOwnedField] (400, ``param``
    the wire field) when ``request`` sets a refused field, whatever its value."""
    for name, _ in REFUSED:
        if request.HasField(name):
            raise _refuse(name)


def check_numbers(numbers: Iterable[int]) -> None:
    """Raise [`RouterOwnedField`][pd_policy.client_errors.RouterOwnedField] when a
    top-level field number of a serialized request is a refused field's."""
    for number in numbers:
        name = _REFUSED_BY_NUMBER.get(number)
        if name is not None:
            raise _refuse(name)


def router_request_id() -> str:
    """A new id for one attempt's legs: the router's own, unique, never the caller's (two
    callers that chose one id would otherwise collide on one engine, and an abort of one
    would end the other's)."""
    return f"pd-{uuid.uuid4().hex}"

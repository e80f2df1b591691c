"""What a KV handoff must name, by connector, for a decode worker to find the KV.

A decode connector that cannot find the transfer loads nothing and the engine
recomputes the prompt locally, with no error (vLLM's NIXL connector logs "Got
invalid KVTransferParams" and carries on). For a stripped multimodal leg that
recompute is image-blind, so a handoff that does not name its transfer is no
handoff. The fields each contract needs:

* ``NIXL``: what vLLM's connector returns from a prefill and reads on decode,
  ``do_remote_prefill`` (true), ``remote_engine_id``, ``remote_block_ids``,
  ``remote_host`` and ``remote_port``. Newer keys (``remote_request_id``,
  ``tp_size``) are not required: older vLLM returns without them.
* ``NIXL_PUSH``: the same fields as ``NIXL`` (vLLM's push connector returns them too).
* ``TRANSFER`` (pd-policy's ``TransferConnector``): ``do_remote_prefill`` (true)
  and the ``transfer_id`` it stored the KV under.
* ``MOONCAKE``: the minted transfer, ``do_remote_prefill`` (true),
  ``transfer_id``, ``remote_engine_id`` and ``remote_bootstrap_addr``; or the
  legacy typed pair, a host and a port in 1..65535.
* ``PASSTHROUGH``: the connector's fields are its own, so any non-empty object
  (or a complete legacy pair) counts; ``{}`` does not.

A field is present when its value is not ``null``, ``""``, ``[]`` or ``{}``; a
flag only when it is ``true``. Pure: stdlib and attrs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from .connectors import KvConnectorMode
from .errors import MalformedRequest
from .jsontext import loads_strict

__all__ = ["KV_FLAG_FIELDS", "REQUIRED_KV_FIELDS", "missing_kv_fields"]

_NIXL: Final = (
    "do_remote_prefill",
    "remote_engine_id",
    "remote_block_ids",
    "remote_host",
    "remote_port",
)

#: The fields a handoff's JSON parameters must carry, by contract (passthrough: any one).
REQUIRED_KV_FIELDS: Final[Mapping[KvConnectorMode, tuple[str, ...]]] = MappingProxyType(
    {
        KvConnectorMode.NIXL: _NIXL,
        # Push returns what pull does; the decode is matched by request id and route.
        KvConnectorMode.NIXL_PUSH: _NIXL,
        KvConnectorMode.TRANSFER: ("do_remote_prefill", "transfer_id"),
        KvConnectorMode.MOONCAKE: (
            "do_remote_prefill",
            "transfer_id",
            "remote_engine_id",
            "remote_bootstrap_addr",
        ),
        KvConnectorMode.PASSTHROUGH: (),
    }
)

#: Fields that count only when ``true``: ``do_remote_prefill: false`` loads nothing.
KV_FLAG_FIELDS: Final = frozenset({"do_remote_prefill"})

_EMPTY: Final[tuple[object, ...]] = (None, "", [], {})


def _params(value: str | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if value is None or isinstance(value, Mapping):
        return value
    try:
        parsed = loads_strict(value, what="kv_transfer_params", param="kv_transfer_params")
    except (MalformedRequest, json.JSONDecodeError, UnicodeDecodeError):
        return {}  # text that is no object names no transfer
    return parsed if isinstance(parsed, dict) else {}


def _present(params: Mapping[str, Any], name: str) -> bool:
    if name not in params:
        return False
    value = params[name]
    if name in KV_FLAG_FIELDS:
        return value is True
    return not any(type(value) is type(empty) and value == empty for empty in _EMPTY)


def missing_kv_fields(
    mode: KvConnectorMode,
    kv_transfer_params: str | Mapping[str, Any] | None,
    kv_legacy: tuple[str, int] | None = None,
) -> tuple[str, ...] | None:
    """What the handoff lacks under ``mode``: ``()`` when complete, the missing field
    names (in [`REQUIRED_KV_FIELDS`][pd_policy.handoff_fields.REQUIRED_KV_FIELDS] order)
    when incomplete, and ``None`` when there is no handoff at all.

    ``kv_transfer_params`` is the JSON form (an object or its text: text that is not a
    strict JSON object counts as an empty one); ``kv_legacy`` the typed
    ``(remote_host, remote_port)`` pair. The legacy pair is a handoff only for
    Mooncake and passthrough: NIXL and the TransferConnector cannot find KV by host
    and port. Passthrough's lack is reported as ``("kv_transfer_params",)``. Never
    raises; the result holds names, never values.
    """
    legacy_ok = (
        kv_legacy is not None
        and mode in (KvConnectorMode.MOONCAKE, KvConnectorMode.PASSTHROUGH)
        and bool(kv_legacy[0])
        and type(kv_legacy[1]) is int
        and 1 <= kv_legacy[1] <= 65535
    )
    if legacy_ok:
        return ()
    params = _params(kv_transfer_params)
    if params is None:
        return None if kv_legacy is None else _gaps(mode, {})
    return _gaps(mode, params)


def _gaps(mode: KvConnectorMode, params: Mapping[str, Any]) -> tuple[str, ...]:
    if mode is KvConnectorMode.PASSTHROUGH:
        present = any(_present(params, name) for name in params)
        return () if present else ("kv_transfer_params",)
    return tuple(name for name in REQUIRED_KV_FIELDS[mode] if not _present(params, name))

"""The conformance operations of the KV wires: what a worker's ``kv_transfer_config`` says.

* ``kv_config_mode``: a prefill's handoff contract from its whole ``kv_transfer_config``
  (a ``MultiConnector``'s connectors, an offloading tier), the operator's ``stated``
  mode optional; or the refusal;
* ``decode_kv``: how a decode worker with this ``kv_transfer_config`` takes KV
  (``loads``, ``on_failure``), and whether a stripped multimodal leg could be answered
  blind there (``blind``, for a language-model-only worker);
* ``leg_routes``: whether legs to ``prefill_route`` and ``decode_route`` may pair under
  the contract ``mode``, or the refusal.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pd_policy.connectors import KvConnectorMode
from pd_policy.errors import MalformedRequest, PolicyError
from pd_policy.wires import check_leg_routes, decode_kv_from_config, handoff_mode

from .reading import error, field, opt_field

__all__ = ["WIRE_OPERATIONS"]


def _mode(value: str, param: str) -> KvConnectorMode:
    try:
        return KvConnectorMode(value)
    except ValueError:
        raise MalformedRequest("an unknown connector mode", param=param) from None


def _config_mode_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    config = field(case, "kv_transfer_config", dict)
    stated = opt_field(case, "stated", str)
    try:
        mode = handoff_mode(config, stated=None if stated is None else _mode(stated, "stated"))
    except PolicyError as exc:
        return error(exc)
    return {"status": 200, "mode": mode.value}


def _decode_kv_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    kv = decode_kv_from_config(field(case, "kv_transfer_config", dict))
    return {
        "status": 200,
        "loads": kv.loads.value,
        "on_failure": kv.on_failure.value,
        "blind": kv.blind_to_stripped_media,
    }


def _routes_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    mode = _mode(field(case, "mode", str), "mode")
    try:
        check_leg_routes(mode, field(case, "prefill_route", str), field(case, "decode_route", str))
    except PolicyError as exc:
        return error(exc)
    return {"status": 200}


#: The wire operations, by name.
WIRE_OPERATIONS: Final = {
    "kv_config_mode": _config_mode_outcome,
    "decode_kv": _decode_kv_outcome,
    "leg_routes": _routes_outcome,
}

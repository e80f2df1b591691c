"""The operations of the conformance vectors: one case in, this implementation's outcome out.

Each operation runs one part of the policy on the case's inputs (see the
package's docs for the list); a policy error is an outcome too: its status,
code and field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from pd_policy.batch import Modality
from pd_policy.codec import request_from_json, request_to_json, worker_from_json
from pd_policy.connectors import KvConnectorMode, PrefillKv, plan_kv_handoff
from pd_policy.encoder_cache import encoder_outputs
from pd_policy.epd import encoder_consumer_leg
from pd_policy.errors import InvalidConfiguration, MalformedRequest, PolicyError
from pd_policy.legs import ensure_language_model_only_leg
from pd_policy.prefill import prefill_leg
from pd_policy.request import LegacyKvParams
from pd_policy.salt import fold_salt, upstream_cache_salt
from pd_policy.selection import DecodeCandidate, ensure_model_accepts_media, select_decode_workers
from pd_policy.tools.outcome import PrefillResult, plan
from pd_policy.wires import connector_mode
from pd_policy.worker import WorkerCapability

__all__ = ["OPERATIONS", "run_case"]

from .client_operations import CLIENT_OPERATIONS
from .exchange_operations import EXCHANGE_OPERATIONS
from .fleet_operations import FLEET_OPERATIONS
from .media_operations import MEDIA_OPERATIONS
from .reading import error as _error
from .reading import field as _field
from .reading import opt_field as _opt_field
from .wire_operations import WIRE_OPERATIONS


def _prefill_mode(spec: Mapping[str, Any]) -> KvConnectorMode:
    mode = _opt_field(spec, "mode", str)
    try:
        return KvConnectorMode(mode if mode is not None else KvConnectorMode.NIXL.value)
    except ValueError:
        raise MalformedRequest("an unknown connector mode", param="prefill.mode") from None


def _plan_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    raw_request, raw_worker = _field(case, "request", dict), _field(case, "decode_worker", dict)
    try:
        # A request or worker the codec refuses is what a "malformed" case is about.
        request, worker = request_from_json(raw_request), worker_from_json(raw_worker)
    except PolicyError as exc:
        return _error(exc)
    prefill = None
    if "prefill" in case:
        spec = _field(case, "prefill", dict)
        returned = _opt_field(spec, "kv_transfer_params", dict)
        legacy = _opt_field(spec, "kv_transfer_params_legacy", dict)
        prefill = PrefillResult(
            None if returned is None else json.dumps(returned, separators=(",", ":")),
            None
            if legacy is None
            else LegacyKvParams(
                _field(legacy, "remote_host", str), _field(legacy, "remote_port", int)
            ),
            _prefill_mode(spec),
        )
    outcome = plan(request, worker, prefill)
    return _error(outcome.error) if outcome.error is not None else outcome.served_json()


def _workers(case: Mapping[str, Any], key: str) -> list[WorkerCapability]:
    return [worker_from_json(w) for w in _field(case, key, list)]


def _select_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(_field(case, "request", dict))
    candidates = [DecodeCandidate(w, i) for i, w in enumerate(_workers(case, "candidates"))]
    try:
        chosen = select_decode_workers(request, candidates)
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200, "selected": [c.handle for c in chosen]}


def _media_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(_field(case, "request", dict))
    workers = _workers(case, "workers")
    try:
        ensure_model_accepts_media(request, workers)
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200}


def _guard_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(_field(case, "request", dict))
    uses_mrope = _field(case, "uses_mrope", bool, default=False)
    takes = _field(case, "takes_mm_metadata", bool, default=False)
    try:
        ensure_language_model_only_leg(request, uses_mrope=uses_mrope, takes_mm_metadata=takes)
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200}


def _identity(item: object) -> tuple[Modality, str]:
    if not (isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)):
        raise MalformedRequest("each identity must be [modality, hash]", param="identities")
    try:
        return Modality(item[0]), item[1]
    except ValueError:
        raise MalformedRequest("an identity names an unknown modality", "identities") from None


def _salt_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    identities = [_identity(i) for i in _field(case, "identities", list)]
    caller = _opt_field(case, "caller_salt", str)
    return {
        "status": 200,
        "cache_salt": fold_salt(identities, caller),
        "upstream_cache_salt": upstream_cache_salt(h for _, h in identities),
    }


def _connector_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    name = _field(case, "kv_connector", str)
    try:
        return {"status": 200, "mode": connector_mode(name).value}
    except PolicyError as exc:
        return _error(exc)


_PREFILL_KV_KEYS: Final = frozenset(
    {"engine_id", "bootstrap_host", "bootstrap_port", "dp_size", "dp_rank"}
)


def _mode(value: str, param: str) -> KvConnectorMode:
    try:
        return KvConnectorMode(value)
    except ValueError:
        raise MalformedRequest("an unknown connector mode", param=param) from None


def _prefill_kv(spec: Mapping[str, Any]) -> PrefillKv:
    mode = _field(spec, "mode", str)
    unknown = sorted(set(spec) - _PREFILL_KV_KEYS - {"mode"})
    if unknown:
        raise MalformedRequest("unknown field", param=f"prefill_kv.{unknown[0]}")
    kind = _mode(mode, "prefill_kv.mode")
    options = {k: v for k, v in spec.items() if k != "mode"}
    return PrefillKv(kind, **options)


def _handoff_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    spec = _field(case, "prefill_kv", dict)
    n = _field(case, "n", int)
    transfer_id = _opt_field(case, "transfer_id", str)
    try:
        kv = _prefill_kv(spec)
        handoff = plan_kv_handoff(kv, n=n, transfer_id=transfer_id)
    except InvalidConfiguration as exc:
        return _error(exc)
    legacy = handoff.decode_legacy
    outcome: dict[str, Any] = {
        "status": 200,
        "runs_prefill": handoff.runs_prefill,
        "prefill_params": None
        if handoff.prefill_params is None
        else json.loads(handoff.prefill_params),
        "decode_params": None
        if handoff.decode_params is None
        else json.loads(handoff.decode_params),
        "decode_legacy": None if legacy is None else [legacy.remote_host, legacy.remote_port],
        "relays": handoff.relays,
        "dp_rank": handoff.dp_rank,
    }
    if "request" in case and handoff.runs_prefill:
        request = request_from_json(_field(case, "request", dict))
        outcome["prefill_leg"] = request_to_json(prefill_leg(request, handoff))
    return outcome


def _epd_prefill_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(_field(case, "request", dict))
    answer = _opt_field(case, "ec_transfer_params", dict)
    try:
        built = encoder_consumer_leg(request, encoder_outputs(answer))
    except PolicyError as exc:
        return _error(exc)
    return {
        "status": 200,
        "form": built.form.value,
        "leg": request_to_json(built.leg),
        "ec_transfer_params": json.loads(built.ec_transfer_params),
    }


#: Every operation a case may name, and what it runs.
OPERATIONS: Final[dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]]] = {
    "plan": _plan_outcome,
    "connector_mode": _connector_outcome,
    "kv_handoff": _handoff_outcome,
    "select_decode_workers": _select_outcome,
    "ensure_model_accepts_media": _media_outcome,
    "worker_guard": _guard_outcome,
    "fold_salt": _salt_outcome,
    "epd_prefill": _epd_prefill_outcome,
    **MEDIA_OPERATIONS,
    **CLIENT_OPERATIONS,
    **FLEET_OPERATIONS,
    **EXCHANGE_OPERATIONS,
    **WIRE_OPERATIONS,
}


def run_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """This implementation's outcome for one case (its ``operation`` and input).

    A policy error the case is about is its outcome, as data. A case of the wrong
    shape (not an object, an unknown operation, a missing or ill-typed field)
    raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] whose ``param`` names the
    field.
    """
    if not isinstance(case, Mapping):
        raise MalformedRequest("a case must be an object", param=None)
    operation = _field(case, "operation", str)
    if operation not in OPERATIONS:
        raise MalformedRequest(
            f"an unknown operation (one of: {', '.join(OPERATIONS)})", "operation"
        )
    return OPERATIONS[operation](case)


# --- the cases ---------------------------------------------------------------------

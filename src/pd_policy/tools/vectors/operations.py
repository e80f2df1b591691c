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
from pd_policy.connectors import KvConnectorMode, PrefillKv, connector_mode, plan_kv_handoff
from pd_policy.errors import PolicyError
from pd_policy.legs import ensure_language_model_only_leg
from pd_policy.prefill import prefill_leg
from pd_policy.request import LegacyKvParams
from pd_policy.salt import fold_salt, upstream_cache_salt
from pd_policy.selection import DecodeCandidate, ensure_model_accepts_media, select_decode_workers
from pd_policy.tools.outcome import PrefillResult, plan

__all__ = ["run_case"]


def _error(exc: PolicyError) -> dict[str, Any]:
    return {"status": exc.status, "error_code": exc.code, "error_param": exc.param}


def _plan_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    try:
        request = request_from_json(case["request"])
        worker = worker_from_json(case["decode_worker"])
    except PolicyError as exc:
        return _error(exc)
    prefill = None
    if "prefill" in case:
        returned = case["prefill"].get("kv_transfer_params")
        legacy = case["prefill"].get("kv_transfer_params_legacy")
        prefill = PrefillResult(
            None if returned is None else json.dumps(returned, separators=(",", ":")),
            None
            if legacy is None
            else LegacyKvParams(legacy["remote_host"], legacy["remote_port"]),
        )
    outcome = plan(request, worker, prefill)
    return _error(outcome.error) if outcome.error is not None else outcome.served_json()


def _select_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(case["request"])
    candidates = [DecodeCandidate(worker_from_json(w), i) for i, w in enumerate(case["candidates"])]
    try:
        chosen = select_decode_workers(request, candidates)
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200, "selected": [c.handle for c in chosen]}


def _media_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    request = request_from_json(case["request"])
    try:
        ensure_model_accepts_media(request, [worker_from_json(w) for w in case["workers"]])
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200}


def _guard_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    try:
        ensure_language_model_only_leg(
            request_from_json(case["request"]),
            uses_mrope=case.get("uses_mrope", False),
            takes_mm_metadata=case.get("takes_mm_metadata", False),
        )
    except PolicyError as exc:
        return _error(exc)
    return {"status": 200}


def _salt_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    identities = [(Modality(m), h) for m, h in case["identities"]]
    return {
        "status": 200,
        "cache_salt": fold_salt(identities, case["caller_salt"]),
        "upstream_cache_salt": upstream_cache_salt(h for _, h in identities),
    }


def _connector_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    try:
        return {"status": 200, "mode": connector_mode(case["kv_connector"]).value}
    except PolicyError as exc:
        return _error(exc)


def _handoff_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    spec = dict(case["prefill_kv"])
    try:
        kv = PrefillKv(KvConnectorMode(spec.pop("mode")), **spec)
    except PolicyError as exc:
        return _error(exc)
    handoff = plan_kv_handoff(kv, n=case["n"], transfer_id=case["transfer_id"])
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
        outcome["prefill_leg"] = request_to_json(
            prefill_leg(request_from_json(case["request"]), handoff)
        )
    return outcome


_OPERATIONS: Final[dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]]] = {
    "plan": _plan_outcome,
    "connector_mode": _connector_outcome,
    "kv_handoff": _handoff_outcome,
    "select_decode_workers": _select_outcome,
    "ensure_model_accepts_media": _media_outcome,
    "worker_guard": _guard_outcome,
    "fold_salt": _salt_outcome,
}


def run_case(case: Mapping[str, Any]) -> dict[str, Any]:
    """This implementation's outcome for one case (its ``operation`` and input)."""
    return _OPERATIONS[case["operation"]](case)


# --- the cases ---------------------------------------------------------------------

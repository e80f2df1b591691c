"""The legs of one Ray Serve LLM P/D request, decided by the core: pure, no Ray.

Ray's own path (``DefaultPDProtocolMixin``) sends decode the client's request as it
came, images included, with the prefill's ``kv_transfer_params`` copied on: its decode
must be a full-vision engine. Here both legs come from the policy's plan
([`plan_request`][pd_policy_vllm.http.plan.plan_request], shared with the HTTP proxy,
since Ray's requests are vLLM's OpenAI requests):

- the prefill leg is the client's body with the output capped at one token, asking for
  the expanded prompt ids, tagged for the handoff;
- the decode leg is the decided form for the decode replica's capability: for a
  language-model-only decode, no media, the prefill's expanded ids, the relayed KV
  parameters and the folded ``cache_salt``; for a vision decode, the body itself with
  the relayed KV parameters.

Bodies go in and out as JSON-shaped dicts, as the HTTP proxy's do, so the two routers
send the same legs for the same request. Every refusal is a typed
[`PolicyError`][pd_policy.errors.PolicyError], raised before any engine is called where
the policy can tell (the carve-outs), or after prefill (a stripped leg without KV: 502).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pd_policy import (
    DecodeCandidate,
    InvalidConfiguration,
    MalformedRequest,
    PrefillKv,
    WorkerCapability,
    connector_mode,
)
from pd_policy_vllm.http.codec import dumps, loads
from pd_policy_vllm.http.plan import Plan, decode_leg, plan_request
from pd_policy_vllm.http.request import Route

__all__ = ["DECODE", "decode_body_for", "plan_legs", "prefill_body_for", "prefill_kv"]

#: The handle the plan names the decode replica by: the server that plans is the decode.
DECODE = "decode"


def prefill_kv(kv_transfer_config: Mapping[str, Any] | None) -> PrefillKv:
    """How the prefill deployment hands KV over, from its ``kv_transfer_config`` (the
    connector's contract, [`connector_mode`][pd_policy.connectors.connector_mode]).

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a missing
    config or a connector whose contract the core does not know."""
    name = (kv_transfer_config or {}).get("kv_connector")
    if not isinstance(name, str) or not name:
        # No connector is no handoff: P/D on Ray needs one (Ray refuses it too).
        raise InvalidConfiguration("the prefill deployment names no kv_connector")
    return PrefillKv(connector_mode(name))


def plan_legs(
    body: Any,
    route: Route,
    capability: WorkerCapability,
    kv: PrefillKv,
    *,
    mrope: bool,
    request_id: str,
) -> Plan[str]:
    """The policy's plan for ``body`` on a decode replica of ``capability``.

    Raises every refusal the policy makes before prefill: a malformed body, the
    carve-outs (M-RoPE grids on a language-model-only decode that cannot take them,
    media references, n>1 with media), a ``cache_salt`` vLLM would refuse. A plan
    whose legs need vLLM's render routes (the M-RoPE metadata path) is refused too,
    naming ``input_ids``: a Ray prefill serves no render route. A plan without a prefill
    leg (n>1 without media) runs decode alone on the decode replica."""
    plan = plan_request(
        body, route, [DecodeCandidate(capability, DECODE)], kv, mrope=mrope,
        request_id=request_id, renders=False,
    )  # fmt: skip
    if plan.render is not None or plan.epd:
        # Unreachable while renders=False and no encoder is named; kept so that a core
        # that grows a path Ray cannot run refuses here, not deep in an engine.
        raise MalformedRequest(
            "this request's legs need vLLM's render route, which a Ray prefill does not serve",
            param="input_ids",
        )
    return plan


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    # A leg holds the prefill's ids as the JSON it sent (TokenIds): written and read
    # back, it is plain JSON types, which pydantic and pickling take.
    value = loads(dumps(body))
    assert isinstance(value, dict)
    return value


def prefill_body_for(plan: Plan[Any]) -> dict[str, Any] | None:
    """The prefill leg's body (JSON types); ``None`` when decode runs alone (n>1 without
    media)."""
    return _plain(plan.prefill) if plan.prefill is not None else None


def decode_body_for(plan: Plan[Any], prefill_response: Mapping[str, Any] | None) -> dict[str, Any]:
    """The decode leg's body (JSON types), from the prefill's response (``model_dump()``
    of vLLM's chat or completion response; ``None`` when no prefill ran).

    Raises [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams] (502) for
    a stripped leg with media that the prefill handed no KV for, and a
    ``prefill_stream_error`` (502) for a response without the expanded prompt ids."""
    response = dict(prefill_response) if prefill_response is not None else None
    return _plain(decode_leg(plan, response).body)

"""The legs of one Ray Serve LLM P/D request, decided by the core: pure, no Ray.

Ray's own path (``DefaultPDProtocolMixin``) sends decode the client's request as it
came, images included, with the prefill's ``kv_transfer_params`` copied on: its decode
must be a full-vision engine. Here both legs come from the policy's plan
([`plan_request`][pd_policy_vllm.openai.plan.steps.plan_request], shared with the HTTP proxy,
since Ray's requests are vLLM's OpenAI requests):

- the prefill leg is the client's body with the output capped at one token, asking for
  the expanded prompt ids, tagged for the handoff;
- the decode leg is the decided form for the decode replica's capability: for a
  language-model-only decode, no media, the prefill's expanded ids, the relayed KV
  parameters and the folded ``cache_salt``; for a vision decode, the body itself with
  the relayed KV parameters.

An M-RoPE image on a language-model-only decode that takes metadata runs the metadata
path instead (``MROPE_METADATA``): the plan holds a render leg for the prefill replica;
once it has answered ([`rendered_plan`][pd_policy_ray.legs.rendered_plan]) the prefill
leg is the rendered request (token-in, pixels included) and the decode leg the rendered
request with each image's hash, placeholder and grid but no pixels, whose tokens the
decode's derender turns back into a chat completion
([`decode_leg_for`][pd_policy_ray.legs.decode_leg_for]).

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
    Request,
    WorkerCapability,
)
from pd_policy.wires import handoff_mode
from pd_policy_vllm.openai.plan.legs import Leg, PrefillReply
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.steps import (
    Plan,
    decode_leg,
    decode_leg_of,
    plan_rendered,
    plan_request,
)
from pd_policy_vllm.openai.wire.codec import dumps, loads

__all__ = [
    "DECODE",
    "decode_body_for",
    "decode_leg_for",
    "plain_leg",
    "plan_legs",
    "prefill_body_for",
    "prefill_kv",
    "rendered_plan",
]

#: The handle the plan names the decode replica by: the server that plans is the decode.
DECODE = "decode"


def prefill_kv(kv_transfer_config: Mapping[str, Any] | None) -> PrefillKv:
    """How the prefill deployment hands KV over, from its ``kv_transfer_config`` (the
    connector's contract, [`handoff_mode`][pd_policy.wires.handoff_mode]).

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a missing
    config or a connector the core refuses or does not know."""
    name = (kv_transfer_config or {}).get("kv_connector")
    if not isinstance(name, str) or not name:
        # No connector is no handoff: P/D on Ray needs one (Ray refuses it too).
        raise InvalidConfiguration("the prefill deployment names no kv_connector")
    return PrefillKv(handoff_mode(kv_transfer_config or {}))


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
    media references, n>1 with media), a ``cache_salt`` vLLM would refuse. The prefill
    replica renders (``PolicyPrefillServer``), so an M-RoPE image on a decode that takes
    metadata gets a plan whose ``render`` is the chat body to render first. A plan
    without a prefill leg or a render (n>1 without media) runs decode alone."""
    plan = plan_request(
        body,
        route,
        [DecodeCandidate(capability, DECODE)],
        kv,
        mrope=mrope,
        request_id=request_id,
        renders=True,
    )
    if plan.epd:
        # Unreachable while no encoder is named; kept so that a core that grows a path
        # Ray cannot run refuses here, not deep in an engine.
        raise MalformedRequest(
            "this request's legs need an encoder, which a Ray P/D graph does not have",
            param="messages",
        )
    return plan


def rendered_plan(plan: Plan[str], render_response: Mapping[str, Any]) -> Plan[str]:
    """The plan once the prefill replica rendered its ``render`` body (the render's JSON).

    Raises a ``prefill_stream_error`` (502) for a render that does not give every image
    a hash, a placeholder and its grid: the decode could not place it."""
    return plan_rendered(plan, render_response)


def _plain(body: Mapping[str, Any]) -> dict[str, Any]:
    # A leg holds the prefill's ids as the JSON it sent (TokenIds): written and read
    # back, it is plain JSON types, which pydantic and pickling take.
    value = loads(dumps(body))
    assert isinstance(value, dict)
    return value


def prefill_body_for(plan: Plan[Any]) -> dict[str, Any] | None:
    """The prefill leg's body (JSON types); ``None`` when decode runs alone (n>1 without
    media). Raises ``ValueError`` for a plan that waits for its render: its prefill leg
    is the render's, not yet known."""
    if plan.render is not None:
        raise ValueError("this plan renders first: its prefill leg comes from rendered_plan")
    return _plain(plan.prefill) if plan.prefill is not None else None


def decode_body_for(plan: Plan[Any], prefill_response: Mapping[str, Any] | None) -> dict[str, Any]:
    """The decode leg's body (JSON types), from the prefill's response (``model_dump()``
    of vLLM's chat or completion response; ``None`` when no prefill ran).

    Raises [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams] (502) for
    a stripped leg with media that the prefill handed no KV for, and a
    ``prefill_stream_error`` (502) for a response without the expanded prompt ids."""
    return decode_leg_for(plan, prefill_response).body


def plain_leg(plan: Plan[Any], leg: Request, reply: PrefillReply | None) -> Leg:
    """The decode leg of the handed-over core ``leg`` and the prefill's ``reply``, its body in
    JSON types (see [`decode_leg_of`][pd_policy_vllm.openai.plan.steps.decode_leg_of]); not
    checked: the exchange checks the handoff before it asks for the decode."""
    made = decode_leg_of(plan, leg, reply)
    return Leg(made.route, _plain(made.body), made.derender)


def decode_leg_for(plan: Plan[Any], prefill_response: Mapping[str, Any] | None) -> Leg:
    """The decode leg, its body in JSON types: a chat or completion body (``route`` is
    the plan's), or on the metadata path a token-in generate body with the ``derender``
    that turns its output into the client's completion. Raises as
    [`decode_body_for`][pd_policy_ray.legs.decode_body_for]."""
    response = dict(prefill_response) if prefill_response is not None else None
    leg = decode_leg(plan, response)
    return Leg(leg.route, _plain(leg.body), leg.derender)

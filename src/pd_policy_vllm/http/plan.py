"""One HTTP request's P/D, as two pure steps around the prefill call.

:func:`plan_request` runs everything the policy decides before prefill: the
body as the policy sees it, the decode worker, the form, the handoff, and the
prefill leg. :func:`decode_leg` runs everything after, from what the prefill
answered: the relay, the handoff check, and the decode leg. The proxy does
its I/O between them; any other proxy can call the same two functions, and the
conformance vectors do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Generic, TypeVar

import attrs

from pd_policy import (
    DecodeCandidate,
    DecodeForm,
    KvHandoff,
    PrefillKv,
    Request,
    apply_kv_handoff,
    build_decode_leg,
    ensure_kv_handoff,
    plan_kv_handoff,
    relay_kv,
    select_decode_workers,
)

from .legs import Leg, decode_body, prefill_body, read_prefill
from .request import Route, policy_request

__all__ = ["Plan", "decode_leg", "plan_request"]

T = TypeVar("T")


@attrs.frozen(slots=True)
class Plan(Generic[T]):
    """What the policy decided before prefill, for one request."""

    route: Route
    body: Mapping[str, Any]
    #: The request as the policy sees it.
    request: Request
    #: The decode candidate chosen (its handle is the caller's).
    decode: DecodeCandidate[T]
    form: DecodeForm
    #: The core's decode leg, carrying what the handoff sends up front.
    leg: Request
    handoff: KvHandoff
    #: The prefill leg's body, or ``None`` when no prefill runs (n>1).
    prefill: dict[str, Any] | None


def plan_request(
    body: Any,
    route: Route,
    candidates: Sequence[DecodeCandidate[T]],
    kv: PrefillKv,
    *,
    mrope: bool,
    request_id: str,
    transfer_id: str | None = None,
) -> Plan[T]:
    """Decide everything before prefill. Raises every refusal the policy can make then:
    malformed bodies, the carve-outs, no decode worker (a typed
    :class:`~pd_policy.PolicyError`). ``transfer_id`` fixes a Mooncake mint."""
    request = policy_request(body, route, request_id=request_id, mrope=mrope)
    chosen = select_decode_workers(request, candidates)[0]
    form, leg = build_decode_leg(request, chosen.worker)
    handoff = plan_kv_handoff(kv, n=request.n, transfer_id=transfer_id)
    leg = apply_kv_handoff(leg, handoff)
    prefill = prefill_body(body, route, handoff) if handoff.runs_prefill else None
    return Plan(route, body, request, chosen, form, leg, handoff, prefill)


def decode_leg(plan: Plan[Any], prefill_response: Mapping[str, Any] | None) -> Leg:
    """The decode leg, from the prefill's (non-streaming) response, ``None`` when no prefill
    ran. Raises :class:`~pd_policy.MissingKvTransferParams` (502) for a stripped image leg
    the prefill handed nothing for, and a ``prefill_stream_error`` (502) for a response
    that does not say what the leg needs."""
    reply = None
    leg = plan.leg
    if plan.prefill is not None:
        if prefill_response is None:
            raise ValueError("a plan with a prefill leg needs the prefill's response")
        reply = read_prefill(prefill_response, plan.route)
        if plan.handoff.relays:
            leg = relay_kv(leg, reply.kv_transfer_params)
    ensure_kv_handoff(plan.request, plan.form, leg)
    return decode_body(plan.body, plan.route, plan.form, leg, reply)

"""One HTTP request's P/D, as pure steps around the calls to the workers.

[`plan_request`][pd_policy_vllm.openai.plan.steps.plan_request] runs everything the
policy decides before prefill: the body as the policy sees it, the decode worker, the
form, the handoff, and the prefill leg. After the prefill,
[`read_reply`][pd_policy_vllm.openai.plan.steps.read_reply] reads its answer,
[`handed_over`][pd_policy_vllm.openai.plan.steps.handed_over] relays its handoff, and
[`decode_leg_of`][pd_policy_vllm.openai.plan.steps.decode_leg_of] builds the decode leg;
a router checks the handoff between the last two (its exchange does), and
[`decode_leg`][pd_policy_vllm.openai.plan.steps.decode_leg] runs all of it, the check
included. The proxy does its I/O between the steps; any other router can call the same
functions, and the conformance vectors do.

An M-RoPE image request whose decode worker takes the image's metadata
(``MROPE_METADATA``) takes one more step, when the prefill worker serves vLLM's render
route: the plan then holds the render leg and no prefill leg, and
[`plan_rendered`][pd_policy_vllm.openai.plan.steps.plan_rendered] turns the render's
answer into the prefill leg (see [`scale_out`][pd_policy_vllm.openai.plan.scale_out]).
E/P/D renders on the encoder, and [`plan_encoded`][
pd_policy_vllm.openai.plan.steps.plan_encoded] turns the encoder's answer into the
prefill leg.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Generic, TypeVar

import attrs

from pd_policy import (
    DecodeCandidate,
    DecodeForm,
    KvHandoff,
    MalformedRequest,
    PrefillForm,
    PrefillKv,
    Request,
    WorkerStreamError,
    apply_kv_handoff,
    build_decode_leg,
    ensure_kv_handoff,
    has_mrope_grids,
    plan_kv_handoff,
    relay_kv,
    select_decode_workers,
)
from pd_policy.wires import check_leg_routes
from pd_policy_vllm.openai.media.identity import WorkerMedia, uncached_parts
from pd_policy_vllm.openai.plan.encode import (
    consumer_prefill_body,
    encode_generate_body,
    read_encode,
)
from pd_policy_vllm.openai.plan.legs import (
    Leg,
    PrefillReply,
    decode_body,
    prefill_body,
    read_prefill,
)
from pd_policy_vllm.openai.plan.request import Route, as_decided, policy_request, runs_epd
from pd_policy_vllm.openai.plan.scale_out import (
    GENERATE,
    Derender,
    Rendered,
    metadata_decode_body,
    prefill_generate_body,
    read_render,
    rendered_request,
)

__all__ = [
    "STRIPPED",
    "Plan",
    "after_prefill",
    "decode_leg",
    "decode_leg_of",
    "handed_over",
    "plan_encoded",
    "plan_rendered",
    "plan_request",
    "read_reply",
]

T = TypeVar("T")

#: The decode forms whose leg carries no media.
STRIPPED: Final = frozenset({DecodeForm.TEXT_PLUS_HASHES, DecodeForm.MROPE_METADATA})


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
    #: The prefill leg's body, or ``None`` when no prefill runs (n>1) or it waits for the
    #: render.
    prefill: dict[str, Any] | None
    #: The route the prefill leg goes to.
    prefill_route: str
    #: The render leg's body (to the prefill worker's
    #: [`RENDER`][pd_policy_vllm.openai.plan.scale_out.RENDER]), when the
    #: metadata path needs it first; else ``None``.
    render: dict[str, Any] | None = None
    #: What the render answered, once it has.
    rendered: Rendered | None = None
    #: Whether the request runs E/P/D: rendered on the encoder, then encoded.
    epd: bool = False
    #: The encode leg's body (to the encoder's ``GENERATE``), once the render answered and
    #: until the encoder has.
    encode: dict[str, Any] | None = None
    #: What the prefill leg carries of each item, in E/P/D.
    prefill_form: PrefillForm | None = None
    #: Whether some item has no reusable identity (a URL the proxy did not fetch): a decode
    #: leg that keeps its media then takes a salt of its own, so that the decode worker,
    #: which reads the URL again, never caches what it read under the prefill's KV.
    uncached: bool = False


def plan_request(
    body: Any,
    route: Route,
    candidates: Sequence[DecodeCandidate[T]],
    kv: PrefillKv,
    *,
    mrope: bool,
    request_id: str,
    transfer_id: str | None = None,
    renders: bool = False,
    encodes: bool = False,
    media: WorkerMedia | None = None,
    nonce: str | None = None,
    request: Request | None = None,
    served_as: str | None = None,
) -> Plan[T]:
    """Decide everything before prefill. Raises every refusal the policy can make then:
    malformed bodies, the carve-outs, no decode worker, and ``echo`` on a request with
    media whose decode leg is stripped (a typed [`PolicyError`][pd_policy.errors.PolicyError]).
    ``transfer_id`` fixes a Mooncake mint.

    ``renders``: the prefill worker serves the render route. Without it, an M-RoPE
    image request has no metadata path, and a language-model-only decode worker is
    refused for it (``pd_decode_language_model_only_mrope``, naming ``input_ids``).

    ``encodes``: an encoder-only worker is configured (and the prefill worker consumes
    its cache). A chat request with media and one sample then runs E/P/D: the plan
    holds the render leg, for the encoder (see [`encode`][pd_policy_vllm.openai.plan.encode]).

    ``media`` is what the prefill worker does with media, and ``nonce`` makes an uncached
    item's identity pure (see
    [`policy_request`][pd_policy_vllm.openai.plan.request.policy_request]).
    ``request`` is that core request when the caller already made it of ``body`` under
    ``media`` (a router that chose its workers on it): it is taken as it is.
    ``served_as``: the decode leg's route when another API is planned as ``route``. Legs
    that must share a route (NIXL push) and would not are refused
    ([`check_leg_routes`][pd_policy.wires.check_leg_routes], 400), before any leg.
    """
    media = media if media is not None else WorkerMedia()
    if request is None:
        request = policy_request(
            body, route, request_id=request_id, mrope=mrope, media=media, nonce=nonce
        )
    uncached = route is Route.CHAT and uncached_parts(body, media.rules)
    epd = runs_epd(request, route, encodes=encodes)
    decided = as_decided(request, route, renders=renders or epd)
    chosen = select_decode_workers(decided, candidates)[0]
    form, leg = build_decode_leg(decided, chosen.worker)
    if body.get("echo") and request.has_mm_inputs and form in STRIPPED:
        # vLLM renders the messages again for echo and ignores the forwarded ids: the
        # stripped leg would be answered image-blind, with a 200.
        raise MalformedRequest(
            "echo cannot be served in P/D for a request with media on a language-model-only "
            "decode worker",
            param="echo",
        )
    handoff = plan_kv_handoff(kv, n=request.n, transfer_id=transfer_id)
    if handoff.runs_prefill:
        metadata = form is DecodeForm.MROPE_METADATA
        to = GENERATE if metadata else served_as or route.value
        check_leg_routes(handoff.mode, GENERATE if epd or metadata else route.value, to)
    # The render's worker fetches and names every item: none is uncached then.
    if epd:  # the legs are built from the encoder's render and answer
        return Plan(
            route, body, request, chosen, form, leg, handoff, None, GENERATE, dict(body), epd=True
        )
    if form is DecodeForm.MROPE_METADATA:
        # The leg is rebuilt from the render's answer (plan_rendered).
        return Plan(route, body, request, chosen, form, leg, handoff, None, GENERATE, dict(body))
    if decided is not request:
        form, leg = build_decode_leg(request, chosen.worker)
    leg = apply_kv_handoff(leg, handoff)
    prefill = prefill_body(body, route, handoff) if handoff.runs_prefill else None
    return Plan(
        route, body, request, chosen, form, leg, handoff, prefill, route.value, uncached=uncached
    )


def plan_rendered(plan: Plan[T], render_response: Mapping[str, Any]) -> Plan[T]:
    """The plan once the render answered: the request as rendered, its decode leg, and the
    prefill leg (the rendered request, to
    [`GENERATE`][pd_policy_vllm.openai.plan.scale_out.GENERATE]).
    Raises a
    ``prefill_stream_error`` (502) for a render that does not say what the decode leg
    needs ([`read_render`][pd_policy_vllm.openai.plan.scale_out.read_render])."""
    if plan.render is None:
        raise ValueError("this plan has no render leg")
    mrope = has_mrope_grids(plan.request)
    rendered = read_render(render_response, metadata=mrope)
    request = rendered_request(plan.request, rendered, mrope=mrope)
    form, leg = build_decode_leg(request, plan.decode.worker)
    if form is not plan.form:
        raise ValueError(f"the rendered request decided {form.name}, not {plan.form.name}")
    leg = apply_kv_handoff(leg, plan.handoff)
    if plan.epd:
        encode = encode_generate_body(rendered)
        return attrs.evolve(
            plan, request=request, leg=leg, render=None, rendered=rendered, encode=encode
        )
    prefill = prefill_generate_body(rendered, plan.handoff)
    return attrs.evolve(
        plan, request=request, leg=leg, prefill=prefill, render=None, rendered=rendered
    )


def plan_encoded(plan: Plan[T], encode_response: Mapping[str, Any]) -> Plan[T]:
    """The plan once the encoder answered: the prefill leg for a cache consumer. Raises
    [`MissingEncoderOutput`][pd_policy.errors.MissingEncoderOutput] (502) when the answer
    does not cover every item under its rendered hash: no prefill is sent then."""
    if plan.encode is None or plan.rendered is None:
        raise ValueError("this plan has no encode leg")
    outputs = read_encode(encode_response)
    form, prefill = consumer_prefill_body(plan.rendered, plan.request, outputs, plan.handoff)
    return attrs.evolve(plan, prefill=prefill, encode=None, prefill_form=form)


def read_reply(plan: Plan[Any], prefill_response: Mapping[str, Any] | bytes) -> PrefillReply:
    """What the prefill's (non-streaming) response (parsed, or its bytes) says for the decode
    leg: its ids, the KV parameters, the usage. Raises a ``prefill_stream_error`` (502)
    for a response that does not say what the leg needs, or whose ids are not the
    rendered ones."""
    # A generate response has its ids at the top level, as a chat response does.
    reply = read_prefill(prefill_response, Route.CHAT if plan.rendered else plan.route)
    if plan.rendered is not None and reply.prompt_token_ids != plan.rendered.token_ids:
        raise WorkerStreamError(
            "prefill", "", "the prefill's prompt ids are not the rendered ones", http_status=502
        )
    return reply


def handed_over(plan: Plan[Any], reply: PrefillReply | None) -> Request:
    """The core decode leg once the prefill answered with ``reply`` (``None`` when no prefill
    ran): what it returned relayed, when the handoff relays. Not checked: the router
    checks it ([`check_kv_handoff`][pd_policy.handoff.check_kv_handoff]) before any decode
    leg is sent. Raises ``ValueError`` for a plan that waits for its render or encoder."""
    if plan.render is not None or plan.encode is not None:
        raise ValueError("the plan waits for its render or its encoder")
    if reply is not None and plan.handoff.relays:
        return relay_kv(plan.leg, reply.kv_transfer_params)
    return plan.leg


def after_prefill(
    plan: Plan[Any], prefill_response: Mapping[str, Any] | bytes
) -> tuple[PrefillReply, Request]:
    """What the prefill answered ([`read_reply`][pd_policy_vllm.openai.plan.steps.read_reply])
    and the core decode leg carrying the handoff it returned
    ([`handed_over`][pd_policy_vllm.openai.plan.steps.handed_over]): what a router checks
    before it builds the decode leg. Raises as ``read_reply``."""
    reply = read_reply(plan, prefill_response)
    return reply, handed_over(plan, reply)


def decode_leg_of(plan: Plan[Any], leg: Request, reply: PrefillReply | None) -> Leg:
    """The decode leg's body, from the handed-over core ``leg`` and the prefill's
    ``reply``. Raises as [`decode_body`][pd_policy_vllm.openai.plan.legs.decode_body]."""
    if plan.rendered is not None and plan.form is DecodeForm.MROPE_METADATA:
        body = metadata_decode_body(plan.rendered, leg)
        return Leg(GENERATE, body, Derender.for_request(plan.body, plan.rendered))
    return decode_body(plan.body, plan.route, plan.form, leg, reply, uncached=plan.uncached)


def decode_leg(plan: Plan[Any], prefill_response: Mapping[str, Any] | bytes | None) -> Leg:
    """The decode leg, from the prefill's (non-streaming) response (parsed, or its bytes),
    ``None`` when no prefill ran: the three steps above, and the handoff checked between
    them. Raises [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams]
    (502) for a stripped image leg the prefill handed nothing for, and a
    ``prefill_stream_error`` (502) for a response that does not say what the leg needs,
    or whose ids are not the rendered ones."""
    if plan.render is not None or plan.encode is not None:
        raise ValueError("the plan waits for its render or its encoder")
    reply = None
    if plan.prefill is not None:
        if prefill_response is None:
            raise ValueError("a plan with a prefill leg needs the prefill's response")
        reply = read_reply(plan, prefill_response)
    leg = handed_over(plan, reply)
    ensure_kv_handoff(plan.request, plan.form, leg, plan.handoff.mode)
    return decode_leg_of(plan, leg, reply)

"""One attempt at a request: its legs, on the members the fleet chose, up to the decode leg.

The plan is the policy's ([`plan`][pd_policy_vllm.http.plan]); this module does its
I/O in order (render, encode, prefill), moving the request's life through its stages
([`pd_policy.lifecycle`][pd_policy.lifecycle]) and timing each leg. It returns the decode
leg for the proxy to relay; any failure is raised, naming its leg, for the proxy to
decide whether the request is tried again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from pd_policy import DecodeCandidate, MalformedRequest, RequestLife, Stage, begin
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.fleet.members import Member
from pd_policy_vllm.http.fleet.metrics import Metrics
from pd_policy_vllm.http.fleet.routing import Choice, decode_capability
from pd_policy_vllm.http.legs import Leg, prefill_bytes
from pd_policy_vllm.http.media_guard import MediaLimits
from pd_policy_vllm.http.pin import RemoteMedia, pin_remote_media, refuse_remote_media
from pd_policy_vllm.http.plan import (
    STRIPPED,
    Plan,
    decode_leg,
    plan_encoded,
    plan_rendered,
    plan_request,
)
from pd_policy_vllm.http.relay import post_json
from pd_policy_vllm.http.request import Route
from pd_policy_vllm.http.scale_out import GENERATE, RENDER
from pd_policy_vllm.http.upstream import Upstream

__all__ = ["Attempt", "Prepared", "remote_media_for"]


def remote_media_for(mode: RemoteMedia | None, prefill: Member) -> RemoteMedia:
    """What to do with remote media on ``prefill``: ``mode``, or by default fetch it when
    the worker's rules are known and leave it uncached when they are not."""
    if mode is not None:
        return mode
    return RemoteMedia.FETCH if prefill.worker.media.rules.known else RemoteMedia.UNCACHED


@attrs.frozen(slots=True)
class Prepared:
    """An attempt up to its decode leg: the plan, the leg, and the request's life."""

    plan: Plan[Member]
    leg: Leg
    life: RequestLife


@attrs.frozen(slots=True)
class Attempt:
    """What every attempt of the proxy shares: its session for remote media (one of
    [`media_session`][pd_policy_vllm.http.media_guard.media_session], with
    ``media_limits``), its client for the legs, the workers' headers, its metrics,
    whether the model uses M-RoPE, its remote media mode (``None``: by each prefill's
    rules), and its own limits on a media fetch."""

    session: aiohttp.ClientSession
    upstream: Upstream
    headers: Mapping[str, str]
    metrics: Metrics
    mrope: bool
    remote_media: RemoteMedia | None
    media_limits: MediaLimits = attrs.field(factory=MediaLimits)

    def plan(
        self, body: Any, route: Route, request_id: str, choice: Choice, *, chosen_on: bool
    ) -> Plan[Member]:
        """The policy's plan on ``choice``'s members (raises every refusal it makes);
        ``chosen_on``: ``body`` is the one the members were chosen for, so the request
        routing made of it serves when its media settings are the prefill's."""
        prefill, decode = choice.prefill, choice.decode
        candidate = DecodeCandidate(decode_capability(decode), decode)
        made = choice.request if chosen_on and choice.media == prefill.worker.media else None
        return plan_request(
            body, route, [candidate], prefill.worker.kv, mrope=self.mrope,
            request_id=request_id, renders=prefill.worker.renders,
            encodes=choice.encoder is not None, media=prefill.worker.media, request=made,
        )  # fmt: skip

    async def _post(self, life: RequestLife, stage: Stage, leg: str, url: str, body: Any,
                    request_id: str, *, parse: bool = True) -> tuple[RequestLife, Any]:  # fmt: skip
        life = begin(life, stage)
        started = time.monotonic()
        answer = await post_json(self.upstream, leg, url, body, request_id, self.headers,
                                 parse=parse)  # fmt: skip
        self.metrics.observe_leg(leg, time.monotonic() - started)
        return life, answer

    async def prepare(
        self, life: RequestLife, body: Any, route: Route, request_id: str, choice: Choice,
        translate: Callable[[Leg, bool], Leg] | None = None,
        raw: bytes | bytearray | None = None,
    ) -> Prepared:  # fmt: skip
        """Run the legs before decode on ``choice``; the decode leg to send.

        ``raw`` is the client's bytes: when ``body`` was parsed from them (no
        ``translate``), a prefill leg of ``body`` itself is those bytes with only the
        members it changes rewritten
        ([`prefill_bytes`][pd_policy_vllm.http.legs.prefill_bytes]), not the body written
        again.

        ``translate`` makes the decode leg of another API from the chat leg planned for
        ``body`` (its chat equivalent: the Responses API), and whether that leg was
        stripped of media. Such a request is refused (400, before any worker is called)
        where the decode leg is not a chat leg (the M-RoPE metadata path, E/P/D), and for
        remote media on a decode leg that keeps it: that leg is the client's own request,
        whose URL the decode would fetch again, and the content could differ from what
        the prefill saw."""
        prefill = choice.prefill
        plan = self.plan(body, route, request_id, choice, chosen_on=True)
        if translate is not None and (plan.render is not None or plan.epd):
            raise MalformedRequest(
                "this API is not served with media on the M-RoPE metadata path or in E/P/D: "
                "its decode leg would be tokens; use /v1/chat/completions",
                param="input",
            )
        if translate is not None and plan.uncached and plan.form not in STRIPPED:
            raise MalformedRequest(
                "remote media over this API needs a language-model-only decode worker: send "
                "it as a data URL, or use /v1/chat/completions",
                param="input",
            )
        mode = remote_media_for(self.remote_media, prefill)
        if plan.uncached and mode is RemoteMedia.REFUSE:
            refuse_remote_media(body, prefill.worker.media.rules)
        if plan.uncached and plan.prefill is not None and mode is RemoteMedia.FETCH:
            # Fetched once, after every refusal the policy can make without it: the same
            # bytes to every leg, and an identity that is their hash.
            rules = prefill.worker.media.rules
            pinned = await pin_remote_media(self.session, body, rules, self.media_limits)
            plan = self.plan(pinned, route, request_id, choice, chosen_on=False)
        encoder = choice.encoder
        if plan.render is not None:
            # In E/P/D the encoder renders: the hashes it stores under are the rendered ones.
            leg, at = ("encode", encoder) if encoder and plan.epd else ("prefill", prefill)
            life, rendered = await self._post(life, Stage.RENDERING, leg, at.worker.url + RENDER,
                                              plan.render, request_id)  # fmt: skip
            plan = plan_rendered(plan, rendered)
        if plan.encode is not None and encoder is not None:
            url = encoder.worker.url + GENERATE
            life, answer = await self._post(life, Stage.ENCODING, "encode", url, plan.encode,
                                            request_id)  # fmt: skip
            plan = plan_encoded(plan, answer)
        response = None
        if plan.prefill is not None:
            leg_body: Any = plan.prefill
            ours = translate is None and plan.body is body
            if raw is not None and ours and plan.prefill_route == route.value:
                # The client's own body (not pinned, rendered or translated): spliced.
                spliced = prefill_bytes(raw, body, route, plan.handoff)
                leg_body = spliced if spliced is not None else plan.prefill
            # Unparsed: the decode leg reads only what it needs, the ids as bytes.
            life, response = await self._post(life, Stage.PREFILLING, "prefill",
                                              prefill.worker.url + plan.prefill_route, leg_body,
                                              request_id, parse=False)  # fmt: skip
        to_decode = decode_leg(plan, response)
        if translate is not None:
            to_decode = translate(to_decode, plan.form in STRIPPED)
        return Prepared(plan, to_decode, begin(life, Stage.DECODING))

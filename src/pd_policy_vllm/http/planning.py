"""The proxy's plan of one attempt on the members the exchange chose: the policy's plan
([`plan_request`][pd_policy_vllm.openai.plan.steps.plan_request]), what the proxy refuses
on top of it, and remote media fetched once per request when the plan needs its bytes
([`pinning`][pd_policy_vllm.http.media.pinning]: kept for every attempt, and checked
again against each attempt's prefill's rules).

Every refusal here is raised before any worker is called, and may be retried only where
its error says (a media host that did not answer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from pd_policy import MalformedRequest, PolicyError, Request
from pd_policy.exchange.events import Event, PlanFailed
from pd_policy.exchange.events import Plan as PlanAction
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.attempt import Attempt
from pd_policy_vllm.http.fleet.members import Fleet, Member
from pd_policy_vllm.http.fleet.routing import Chosen
from pd_policy_vllm.http.front_door import Incoming
from pd_policy_vllm.http.media.fetch import Budget, RemoteMedia, refuse_remote_media
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.media.pinning import Fetches, fetch_budget, pin_remote_media
from pd_policy_vllm.openai.plan.events import planned
from pd_policy_vllm.openai.plan.render_once import plan_render_once, render_tensors
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.steps import STRIPPED, Plan, plan_rendered, plan_request
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["Planning", "remote_media_for"]


def remote_media_for(mode: RemoteMedia | None, prefill: Member) -> RemoteMedia:
    """What to do with remote media on ``prefill``: ``mode``, or by default fetch it when
    the worker's rules are known and leave it uncached when they are not."""
    if mode is not None:
        return mode
    return RemoteMedia.FETCH if prefill.worker.media.rules.known else RemoteMedia.UNCACHED


def _rendered_before(
    plan: Plan[Member], attempt: Attempt, chosen: Chosen, render_once: bool
) -> Plan[Member]:
    # A request the KV-event lookup rendered already (the same body, on the same route,
    # under the same media settings) is not rendered twice: the M-RoPE metadata path takes
    # the render it would ask the prefill for, and with ``render_once`` any other plan
    # sends its prefill leg as token-in from it (render_once's rules). E/P/D renders on its
    # encoder, whose failure is the encoder's: left as it is.
    lookup = attempt.lookup
    if (
        lookup is None
        or lookup.rendered is None
        or lookup.route is not plan.route
        or plan.body is not attempt.incoming.body
        or chosen.request is None
    ):
        return plan
    incoming = attempt.incoming
    try:
        if plan.render is not None:
            metadata = not plan.epd and plan.route is Route.CHAT
            return plan_rendered(plan, lookup.rendered) if metadata else plan
        if not render_once:
            return plan
        # Another API planned as chat sends its decode leg to its own route.
        decode_route = incoming.path if incoming.translate is not None else plan.route.value
        prefill = chosen.placement.prefill
        return plan_render_once(
            plan, lookup.rendered, decode_route=decode_route, serves_generate=prefill.worker.renders
        )
    except PolicyError:
        return plan  # rendered again, on the prefill, as without the lookup


@attrs.frozen(slots=True)
class Planning:
    """What the plans of a proxy share: whether the model uses M-RoPE, its remote media
    mode (``None``: by each prefill's rules), its own limits on a media fetch, the
    session it fetches with (one of
    [`media_session`][pd_policy_vllm.http.media.guard.media_session]), and the bytes one
    request's fetches may read together
    ([`fetch_budget`][pd_policy_vllm.http.media.pinning.fetch_budget]). ``render_once``:
    a prefill leg is token-in from the KV-event lookup's render where the plan allows
    ([`render_once`][pd_policy_vllm.openai.plan.render_once]). ``fetched`` is told how
    each remote fetch ended."""

    mrope: bool
    remote_media: RemoteMedia | None
    media_limits: MediaLimits
    session: aiohttp.ClientSession
    fetch_budget: int = fetch_budget()
    render_once: bool = True
    #: Told each remote fetch's end: ``ok``, or its error code (the proxy's metrics).
    fetched: Callable[[str], None] | None = None

    def lookup_tensors(self, fleet: Fleet) -> bool:
        """Whether a lookup's render of a request on ``fleet`` asks for the items'
        processed tensors: when a plan may take the render over
        ([`render_tensors`][pd_policy_vllm.openai.plan.render_once.render_tensors])."""
        modes = (m.worker.kv.mode for m in fleet.of("prefill"))
        return render_tensors(mrope=self.mrope, render_once=self.render_once, modes=modes)

    def _plan(
        self, body: Any, incoming: Incoming, chosen: Chosen, made: Request | None
    ) -> Plan[Member]:
        placement = chosen.placement
        prefill = placement.prefill
        return plan_request(
            body,
            incoming.route,
            [chosen.decode],
            prefill.worker.kv,
            mrope=self.mrope,
            request_id=incoming.request_id,
            renders=prefill.worker.renders,
            encodes=placement.encoder is not None,
            media=prefill.worker.media,
            request=made,
            # Another API planned as chat sends its decode leg to its own route.
            served_as=incoming.path if incoming.translate is not None else None,
        )

    async def planned(self, attempt: Attempt, action: PlanAction[HttpWorker]) -> Event:
        """The exchange's ``Plan``, done: the attempt's plan on its members, as the event
        that says what it needs (or why it could not be made)."""
        if action.after is not None:
            attempt.retried.append(action.leg.value if action.leg is not None else "plan")
        attempt.placement, attempt.plan, attempt.leg, attempt.reply = (
            action.placement,
            None,
            None,
            None,
        )
        chosen = attempt.placer.chosen
        assert chosen is not None and chosen.placement is action.placement
        if attempt.fetches is None:
            attempt.fetches = Fetches(Budget(self.fetch_budget), fetched=self.fetched)
        try:
            plan = await self.plan(attempt.incoming, chosen, attempt.fetches)
        except PolicyError as exc:
            return PlanFailed(exc)
        plan = _rendered_before(plan, attempt, chosen, self.render_once)
        attempt.plan, attempt.form = plan, plan.form.value
        return planned(plan)

    async def plan(
        self, incoming: Incoming, chosen: Chosen, fetches: Fetches | None = None
    ) -> Plan[Member]:
        """The plan of an attempt at ``incoming`` on the members ``chosen`` (by the
        proxy's placement, with the request it may reuse), its remote media fetched into
        ``fetches`` (the request's, kept across its attempts; ``None``: this attempt's
        own). Raises every refusal the policy makes before prefill, the proxy's own
        refusals of another API's legs, and those of a remote media fetch.

        Another API planned as chat (the Responses API: ``translate``) is refused (400)
        where its decode leg is not a chat leg (the M-RoPE metadata path, E/P/D), and for
        remote media on a decode leg that keeps it: that leg is the client's own request,
        whose URL the decode would fetch again, and the content could differ from what
        the prefill saw."""
        prefill = chosen.placement.prefill
        body = incoming.body
        mode = remote_media_for(self.remote_media, prefill)
        rules = prefill.worker.media.rules
        plan = self._plan(body, incoming, chosen, chosen.request)
        if incoming.translate is not None:
            if plan.render is not None or plan.epd:
                raise MalformedRequest(
                    "this API is not served with media on the M-RoPE metadata path or in "
                    "E/P/D: its decode leg would be tokens; use /v1/chat/completions",
                    param="input",
                )
            if plan.uncached and plan.form not in STRIPPED:
                raise MalformedRequest(
                    "remote media over this API needs a language-model-only decode worker: "
                    "send it as a data URL, or use /v1/chat/completions",
                    param="input",
                )
        if plan.uncached and mode is RemoteMedia.REFUSE:
            refuse_remote_media(body, rules)
        if plan.uncached and plan.prefill is not None and mode is RemoteMedia.FETCH:
            # Fetched once a request, after every refusal the policy can make without it:
            # the same bytes to every leg of every attempt, and an identity of their hash.
            pinned = await pin_remote_media(self.session, body, rules, self.media_limits, fetches)
            plan = self._plan(pinned, incoming, chosen, None)
        return plan

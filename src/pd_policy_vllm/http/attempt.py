"""What one request keeps between its exchange's actions: the request as admitted, the
attempt's members and plan, what its prefill answered, its relay, and the time each leg
took (the metrics are written once, when the exchange ends)."""

from __future__ import annotations

import attrs

from pd_policy import Placement, Request
from pd_policy_vllm.http.aio import web
from pd_policy_vllm.http.fleet.kv_routing import Lookup
from pd_policy_vllm.http.fleet.members import Member
from pd_policy_vllm.http.fleet.routing import HttpPlacer
from pd_policy_vllm.http.front_door import Incoming
from pd_policy_vllm.http.media.pinning import Fetches
from pd_policy_vllm.http.relay import DecodeRelay
from pd_policy_vllm.openai.plan.legs import PrefillReply
from pd_policy_vllm.openai.plan.steps import Plan
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["Attempt"]


@attrs.define
class Attempt:
    """One request's state. ``client`` is its ``aiohttp`` request, ``arrived`` when it
    arrived (``time.monotonic``), ``placer`` its placement. The rest is the attempt under
    way: ``plan``, the policy's, and its decode ``form``; ``leg``, the core decode leg once
    the prefill handed KV over; ``reply``, what the prefill answered; ``relay``, the decode
    relayed. And what was measured: ``legs``, each leg's name and seconds; ``retried``,
    the legs whose failures were tried again. ``fetches``: the remote media fetched for
    the request, once, kept for its every attempt."""

    incoming: Incoming
    client: web.Request
    arrived: float
    placer: HttpPlacer
    placement: Placement[HttpWorker] | None = None
    plan: Plan[Member] | None = None
    leg: Request | None = None
    reply: PrefillReply | None = None
    relay: DecodeRelay | None = None
    #: The decode form of the last plan, ``-`` before any.
    form: str = "-"
    #: What the prefills' KV caches hold of the request, when it was looked up.
    lookup: Lookup | None = None
    legs: list[tuple[str, float]] = attrs.field(factory=list)
    retried: list[str] = attrs.field(factory=list)
    fetches: Fetches | None = None

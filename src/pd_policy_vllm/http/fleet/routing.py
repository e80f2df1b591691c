"""Which members of the fleet take an attempt at a request: the proxy's placement, one call
into the core's [`place`][pd_policy.fleet.placement.place] per attempt.

The rules are the core's, shared with the gRPC fleet: compatible first, then routable,
then affinity to the request's media for the encoder and prefill, load for the decode.
What is the proxy's own:

- the request is read once, under the media settings every prefill shares (the common
  case: else the plan reads it again under the chosen prefill's), and its refusals (a
  malformed body, a URL the workers would not read) end the exchange before any worker
  is called;
- the prefill that holds the most of the request's leading KV blocks takes it, within the
  load bound, when they were looked up (``cached``:
  [`kv_routing`][pd_policy_vllm.http.fleet.kv_routing]);
- a decode worker that takes M-RoPE metadata takes it only when it and the chosen prefill
  both serve vLLM's scale-out routes; else it is a plainly language-model-only worker
  for this request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from pd_policy import DecodeCandidate, Placement, Request, Support, WorkerCapability, place
from pd_policy_vllm.http.fleet.members import Fleet, Member
from pd_policy_vllm.openai.media.identity import WorkerMedia
from pd_policy_vllm.openai.plan.request import Route, as_decided, policy_request, runs_epd
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["Chosen", "HttpPlacer", "decode_capability"]


def decode_capability(decode: Member) -> WorkerCapability:
    """``decode``'s capability as a router may use it: the metadata path needs the
    scale-out routes on both workers. A decode without them is plainly
    language-model-only; a prefill without them leaves the request unrendered (the
    request decided on, [`as_decided`][pd_policy_vllm.openai.plan.request.as_decided]),
    which the core refuses for the metadata path by naming what is missing
    (``input_ids``)."""
    capability = decode.worker.capability
    if capability.takes_mm_metadata and not decode.worker.renders:
        return attrs.evolve(capability, accepts_mm_metadata=Support.FALSE)
    return capability


def _capability(member: Member) -> WorkerCapability:
    return decode_capability(member) if member.role == "decode" else member.worker.capability


@attrs.frozen(slots=True)
class Chosen:
    """What the plan of an attempt takes from its choice: the ``placement``, the ``decode``
    as a candidate (its capability as a router may use it), and the core ``request`` the
    members were chosen for when the plan may take it as it is (read under the chosen
    prefill's media settings; else ``None``)."""

    placement: Placement[HttpWorker]
    decode: DecodeCandidate[Member]
    request: Request | None


class HttpPlacer:
    """The placement of one request's attempts on ``fleet``: call it with the names of the
    members to leave out (see the module docs).

    Raises what [`policy_request`][pd_policy_vllm.openai.plan.request.policy_request]
    raises for a body no worker could serve, and what ``place`` raises:
    [`MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported] (400) when no
    listed prefill can process its media, the carve-out that explains why when no listed
    decode can serve it, and [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable]
    (503, retryable) for a role whose compatible members are all out of service.
    """

    def __init__(
        self, fleet: Fleet, body: Mapping[str, Any], route: Route, *, mrope: bool, request_id: str
    ) -> None:
        self.fleet, self.body, self.route = fleet, body, route
        self.mrope, self.request_id = mrope, request_id
        settings = [m.worker.media for m in fleet.of("prefill")]
        #: The media settings the request was read under: every prefill's, when they agree.
        self.media: WorkerMedia | None = (
            settings[0] if settings and all(s == settings[0] for s in settings) else None
        )
        self._request: Request | None = None
        #: The last choice, for the plan of its attempt.
        self.chosen: Chosen | None = None
        #: How many of the request's leading KV blocks each prefill holds, by name, when
        #: they were looked up (KV-event routing); else ``None``.
        self.cached: Mapping[str, int] | None = None

    @property
    def request(self) -> Request:
        """The core request the members are chosen for (read on first use)."""
        if self._request is None:
            self._request = policy_request(
                self.body,
                self.route,
                request_id=self.request_id,
                mrope=self.mrope,
                media=self.media,
            )
        return self._request

    def __call__(self, excluded: tuple[str, ...]) -> Placement[HttpWorker]:
        request, route = self.request, self.route

        def decided(prefill: Member, encoded: bool) -> Request:
            return as_decided(request, route, renders=prefill.worker.renders or encoded)

        encode = runs_epd(request, route, encodes=True)
        placed = place(
            self.fleet,
            request,
            capability=_capability,
            exclude=excluded,
            decided=decided,
            encode=encode,
            cached=self.cached,
        )
        decode = placed.decode
        # The identities depend on the prefill's media settings: the request is taken as
        # it is only under the settings it was read under.
        same = self.media == placed.prefill.worker.media
        candidate = DecodeCandidate(decode_capability(decode), decode)
        self.chosen = Chosen(placed, candidate, request if same else None)
        return placed

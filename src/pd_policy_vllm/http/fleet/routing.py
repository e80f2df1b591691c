"""Which members of the fleet take one attempt at a request: a prefill, a decode, and in
E/P/D an encoder, chosen by the core's rules before any worker is called.

The rules are the core's ([`place`][pd_policy.placement.place]), shared with the
gRPC fleet: compatible first, then routable, then affinity to the request's media for
the encoder and prefill, load for the decode. A decode worker that takes M-RoPE metadata takes it
only when it and the chosen prefill both serve vLLM's scale-out routes; else it is a
plainly language-model-only worker for this request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from pd_policy import (
    PolicyError,
    Request,
    Support,
    WorkerCapability,
    WorkerFailedToStart,
    place,
)
from pd_policy_vllm.http.fleet.members import Fleet, Member
from pd_policy_vllm.http.identity import WorkerMedia
from pd_policy_vllm.http.plan import as_decided, runs_epd
from pd_policy_vllm.http.request import Route, policy_request

__all__ = ["Choice", "choose_members", "decode_capability"]


@attrs.frozen(slots=True)
class Choice:
    """The members one attempt goes to (no encoder outside E/P/D), and the core request
    they were chosen for with the media settings its identities were made under: the
    plan takes it as it is when the chosen prefill's settings are those."""

    prefill: Member
    decode: Member
    encoder: Member | None = None
    request: Request | None = attrs.field(default=None, eq=False)
    media: WorkerMedia | None = attrs.field(default=None, eq=False)

    @property
    def members(self) -> tuple[Member, ...]:
        return tuple(m for m in (self.encoder, self.prefill, self.decode) if m is not None)

    def of(self, leg: str) -> Member | None:
        """The member of ``leg`` (``encode``, ``prefill``, ``decode``)."""
        return {"encode": self.encoder, "prefill": self.prefill, "decode": self.decode}.get(leg)

    def blame(self, fleet: Fleet, error: PolicyError) -> Member | None:
        """The member ``error`` is on, counted against its health in ``fleet`` when the
        worker failed (a 5xx, or unreachable), not the request (a 4xx)."""
        leg = getattr(error, "leg", None)
        member = self.of(leg) if isinstance(leg, str) else None
        if member is not None and isinstance(error, WorkerFailedToStart) and error.status >= 500:
            fleet.failed(member)
        return member


def decode_capability(decode: Member) -> WorkerCapability:
    """``decode``'s capability as a router may use it: the metadata path needs the
    scale-out routes on both workers. A decode without them is plainly
    language-model-only; a prefill without them leaves the request unrendered (the
    request decided on, [`as_decided`][pd_policy_vllm.http.plan.as_decided]), which the
    core refuses for the metadata path by naming what is missing (``input_ids``)."""
    capability = decode.worker.capability
    if capability.takes_mm_metadata and not decode.worker.renders:
        return attrs.evolve(capability, accepts_mm_metadata=Support.FALSE)
    return capability


def choose_members(
    fleet: Fleet, body: Mapping[str, Any], route: Route, *, mrope: bool,
    exclude: Sequence[str] = (), request_id: str = "routing",
) -> Choice:  # fmt: skip
    """The members that take an attempt at ``body``, leaving out those named in
    ``exclude`` (an earlier attempt failed on them), by the core's
    [`place`][pd_policy.placement.place].

    Raises what [`plan_request`][pd_policy_vllm.http.plan.plan_request] raises before
    prefill for a body no worker could serve (the carve-outs, a malformed body), and
    what ``place`` raises: [`MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported]
    (400) when no listed prefill worker can process its media, and
    [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable] (503, retryable) for a role
    whose compatible members are all out of service.
    """
    # The identities depend on the prefill's media settings: made once under the settings
    # every prefill shares (the common case), and again by the plan otherwise.
    settings = [m.worker.media for m in fleet.of("prefill")]
    media = settings[0] if settings and all(s == settings[0] for s in settings) else None
    request = policy_request(body, route, request_id=request_id, mrope=mrope, media=media)

    def capability(member: Member) -> WorkerCapability:
        return decode_capability(member) if member.role == "decode" else member.worker.capability

    def decided(prefill: Member, encoded: bool) -> Request:
        return as_decided(request, route, renders=prefill.worker.renders or encoded)

    placed = place(
        fleet, request, capability=capability, exclude=exclude, decided=decided,
        encode=runs_epd(request, route, encodes=True),
    )  # fmt: skip
    return Choice(placed.prefill, placed.decode, placed.encoder, request, media)

"""``SequentialPd``: one sequential P/D request over ``grpc.aio``, with the policy applied.

The I/O edge of the adapter. Everything it decides, it asks the policy: the
carve-outs are raised before any RPC, the KV handoff is planned by the core,
the decode leg is built by the leg builders, and the handoff is checked before
the decode request is sent.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping

import grpc
from pd_policy import DecodeCandidate, plan_kv_handoff, select_decode_workers
from pd_policy.exchange.events import HandoffCheck, KvFacts

from .admission import admit_message
from .calls import PdCalls
from .driver import PairAttempt, drive, one_pair_of
from .kv import apply_kv_handoff, prefill_leg, relay_kv
from .legs import build_decode_leg
from .view import has_mm_inputs, kv_handoff_facts, request_view
from .wire import pb

__all__ = ["SequentialPd"]


class SequentialPd(PdCalls):
    """Serve ``GenerateRequest`` messages through a prefill worker and a decode worker.

    ``decode`` is either one decode channel, with ``decode_worker`` its
    advertised capability (for example
    [`pd_policy_grpc.capability_from_info`][pd_policy_grpc.capability.capability_from_info]
    of its info responses), or several
    [`pd_policy.DecodeCandidate`][pd_policy.selection.DecodeCandidate] whose
    handles are channels, in the caller's order of preference. ``kv`` is how
    the prefill worker hands KV over: a [`pd_policy.PrefillKv`][pd_policy.connectors.PrefillKv] (see
    [`pd_policy_grpc.prefill_kv_from_info`][pd_policy_grpc.kv.prefill_kv_from_info]), or just a
    [`pd_policy.KvConnectorMode`][pd_policy.connectors.KvConnectorMode] for NIXL or passthrough.

    [`generate`][pd_policy_grpc.client.SequentialPd.generate]:

    1. picks the first decode candidate that can serve the request
       ([`pd_policy.select_decode_workers`][pd_policy.selection.select_decode_workers]: a
       language-model-only worker is
       never picked for a request it cannot serve while a capable one is
       listed), decides the decode form and builds the decode leg. When no
       candidate can serve it, the carve-out raises its 400 before any request
       is sent;
    2. plans the handoff ([`pd_policy.plan_kv_handoff`][pd_policy.connectors.plan_kv_handoff]) and
       puts on the
       decode leg what it sends up front (a minted Mooncake transfer, the
       legacy host and port);
    3. unless the request asks for n>1 (then decode runs alone), runs the
       sanitised prefill leg, waits for its ``GenerateComplete`` and relays the
       KV parameters it returned, when the handoff relays;
    4. checks the handoff: a stripped multimodal leg without one raises the 502;
    5. streams the decode leg's responses.

    Its life is an [`Exchange`][pd_policy.exchange.machine.Exchange] of one attempt on its one
    pair ([`drive`][pd_policy_grpc.driver.drive]), as [`FleetPd`][pd_policy_grpc.fleet.FleetPd]
    drives one per request over a fleet: the steps above are its actions.

    Errors come out typed, as [`PolicyError`][pd_policy.errors.PolicyError]: the policy's own,
    a policy error a worker returned (read from its trailing metadata), or a
    worker's failure naming its leg (``prefill_worker_failed_to_start``,
    ``decode_worker_failed_to_start``, ``*_stream_error``) with its gRPC status
    mapped to HTTP.

    Aborts: a prefill leg that has not completed is aborted at once when the
    request fails, is cancelled or is dropped. A decode leg dropped before its
    first response is aborted only after that response arrives (or after
    ``deferred_abort_max_wait`` seconds): until then the KV transfer may be in
    flight, and aborting a decode mid-transfer can crash or leak on the engine
    side. Later, it is aborted at once. Await [`aclose`][pd_policy_grpc.client.SequentialPd.aclose]
    to wait for
    deferred aborts, when shutting down.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] at construction for a
    bare
    ``KvConnectorMode.MOONCAKE`` (Mooncake needs the worker's bootstrap host).
    """

    def attempt(self, request: pb.GenerateRequest) -> PairAttempt[pb.GenerateRequest]:
        """The attempt at ``request`` (steps 1 and 2 of the class docs): the decode leg,
        carrying what the handoff sends up front. Raises the policy's refusals."""
        chosen = self.choose(request)
        # Choosing among several candidates already checked the message.
        form, leg = build_decode_leg(request, chosen.worker, check=len(self.candidates) == 1)
        handoff = plan_kv_handoff(self.kv, n=request.sampling_params.n)
        apply_kv_handoff(leg, handoff)
        leg.request_id = own = self._request_id(request.request_id)
        check = HandoffCheck(form, has_mm_inputs(request), handoff.mode)
        stub = self._stubs[id(chosen.handle)]
        return PairAttempt(leg, stub, handoff.runs_prefill, check, handoff, own)

    def handoff_of(self, attempt: PairAttempt[pb.GenerateRequest]) -> KvFacts:
        """The handoff the attempt's decode leg carries now."""
        return KvFacts(*kv_handoff_facts(attempt.leg))

    async def prefill(
        self, request: pb.GenerateRequest, attempt: PairAttempt[pb.GenerateRequest]
    ) -> None:
        """Step 3: the sanitised prefill leg, and what it returned relayed."""
        handoff = attempt.handoff
        leg = prefill_leg(request, handoff)
        leg.request_id = attempt.request_id
        complete = await self._run_prefill(leg, attempt.request_id, attempt.metadata)
        if handoff.relays:
            relay_kv(attempt.leg, complete)

    def decode(
        self, request: pb.GenerateRequest, attempt: PairAttempt[pb.GenerateRequest]
    ) -> AsyncGenerator[pb.GenerateResponse]:
        """Step 5: the decode leg's responses."""
        return self._stream_decode(
            attempt.decode, attempt.leg, attempt.request_id, attempt.metadata
        )

    def generate(
        self, request: pb.GenerateRequest, *, trace_context: Mapping[str, str] | None = None
    ) -> AsyncGenerator[pb.GenerateResponse]:
        """Serve ``request``; yields the decode worker's responses. See the class docs.
        ``trace_context``: the caller's W3C trace headers, passed on to both legs as gRPC
        metadata when valid ([`drive`][pd_policy_grpc.driver.drive])."""
        return drive(request, self.own, one_pair_of, read=self.admit, trace_context=trace_context)

    def admit(self, request: pb.GenerateRequest) -> pb.GenerateRequest:
        """``request`` once admitted
        ([`admit_message`][pd_policy_grpc.admission.admit_message], under this router's
        ``max_media_items``): what ``generate`` checks first."""
        return admit_message(request, self.max_media_items)

    def choose(self, request: pb.GenerateRequest) -> DecodeCandidate[grpc.aio.Channel]:
        """The decode candidate [`generate`][pd_policy_grpc.client.SequentialPd.generate] would use
        for ``request``.

        Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] and, when no candidate can
        serve it, the carve-out that explains why.
        """
        if len(self.candidates) == 1:
            return self.candidates[0]  # build_decode_leg decides and refuses for it
        return select_decode_workers(request_view(request), self.candidates)[0]

"""``SequentialPdBytes``: sequential P/D on serialized requests, end to end.

A router that serves the engine's service through a generic handler holds each
request as the bytes it received. This router takes those bytes, cuts both legs
from them ([`legs`][pd_policy_grpc.raw.legs]) and sends the legs over channels whose
``Generate`` has identity serializers, so no pixel is parsed, copied into a
message or serialized again: the one copy of the payload is the prefill leg's
own bytes. The decode worker's responses come back as bytes, for the router to
forward as they are; only the prefill's responses (a token and the KV handoff)
are parsed.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from typing import Any, Final

import grpc
from pd_policy import DecodeCandidate, plan_kv_handoff, select_decode_workers
from pd_policy.exchange.events import HandoffCheck, KvFacts
from pd_policy_grpc.calls import PdCalls
from pd_policy_grpc.driver import PairAttempt, drive, one_pair_of
from pd_policy_grpc.raw.admission import read_admitted
from pd_policy_grpc.raw.legs import (
    apply_kv_handoff,
    build_decode_leg,
    prefill_leg,
    relay_kv,
    with_request_id,
)
from pd_policy_grpc.raw.reader import RawRequest
from pd_policy_grpc.raw.splice import RawLeg
from pd_policy_grpc.view import has_mm_inputs
from pd_policy_grpc.wire import pb

__all__ = ["BytesStub", "SequentialPdBytes"]

_SERVICE: Final = pb.DESCRIPTOR.services_by_name["VllmEngine"].full_name


class BytesStub:
    """The engine's ``Generate`` with bytes in and bytes out, and its ``Abort`` as usual."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        # No serializers: grpc passes the bytes through untouched.
        self.Generate: Any = channel.unary_stream(f"/{_SERVICE}/Generate")
        self.Abort: Any = channel.unary_unary(
            f"/{_SERVICE}/Abort",
            request_serializer=pb.AbortRequest.SerializeToString,
            response_deserializer=pb.AbortResponse.FromString,
        )


class SequentialPdBytes(PdCalls):
    """[`SequentialPd`][pd_policy_grpc.client.SequentialPd] on serialized requests.

    Constructed with the same arguments, it serves the same legs under the same
    rules, errors and aborts; [`generate`][pd_policy_grpc.raw.client.SequentialPdBytes.generate]
    takes a serialized ``GenerateRequest`` and yields each decode response as the
    worker serialized it. The legs also carry the top-level fields this version
    of the proto does not know.
    """

    _stub = BytesStub

    @staticmethod
    def _prefill_response(item: Any) -> pb.GenerateResponse:
        return pb.GenerateResponse.FromString(item)

    def attempt(self, request: RawRequest) -> PairAttempt[RawLeg]:
        """The attempt at a read ``request``, as
        [`SequentialPd.attempt`][pd_policy_grpc.client.SequentialPd.attempt] makes it."""
        chosen = self.choose(request)
        form, leg = build_decode_leg(request, chosen.worker)
        handoff = plan_kv_handoff(self.kv, n=request.n)
        check = HandoffCheck(form, has_mm_inputs(request.skeleton), handoff.mode)
        stub = self._stubs[id(chosen.handle)]
        own = self._request_id(request.skeleton.request_id)
        leg = with_request_id(apply_kv_handoff(leg, handoff), own)
        return PairAttempt(leg, stub, handoff.runs_prefill, check, handoff, own)

    def handoff_of(self, attempt: PairAttempt[RawLeg]) -> KvFacts:
        """The handoff the attempt's decode leg carries now."""
        return KvFacts(*attempt.leg.kv_handoff_facts())

    async def prefill(self, request: RawRequest, attempt: PairAttempt[RawLeg]) -> None:
        """The sanitised prefill leg, and what it returned relayed."""
        handoff = attempt.handoff
        leg = bytes(with_request_id(prefill_leg(request, handoff), attempt.request_id))
        complete = await self._run_prefill(leg, attempt.request_id, attempt.metadata)
        if handoff.relays:
            attempt.leg = relay_kv(attempt.leg, complete)

    def decode(self, request: RawRequest, attempt: PairAttempt[RawLeg]) -> AsyncGenerator[bytes]:
        """The decode leg's responses, as the worker serialized them."""
        return self._stream_decode(
            attempt.decode, bytes(attempt.leg), attempt.request_id, attempt.metadata
        )

    def generate(
        self, data: bytes | RawRequest, *, trace_context: Mapping[str, str] | None = None
    ) -> AsyncGenerator[bytes]:
        """Serve a serialized request (or one already read); yields the decode responses'
        bytes.

        Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for bytes that are not
        a valid ``GenerateRequest``, and everything
        [`SequentialPd.generate`][pd_policy_grpc.client.SequentialPd.generate] raises;
        ``trace_context`` as there.
        """
        return drive(data, self.own, one_pair_of, read=self.admit, trace_context=trace_context)

    def admit(self, data: bytes | RawRequest) -> RawRequest:
        """``data`` read (unless it already is) and admitted
        ([`read_admitted`][pd_policy_grpc.raw.admission.read_admitted], under this router's
        ``max_media_items``): what ``generate`` does first."""
        return read_admitted(data, self.max_media_items)

    def choose(self, request: RawRequest) -> DecodeCandidate[grpc.aio.Channel]:
        """The decode candidate ``generate`` would use for ``request``; raises as
        [`SequentialPd.choose`][pd_policy_grpc.client.SequentialPd.choose] does."""
        if len(self.candidates) == 1:
            return self.candidates[0]
        return select_decode_workers(request.view(), self.candidates)[0]

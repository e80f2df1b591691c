"""``SequentialPd``: one sequential P/D request over ``grpc.aio``, with the policy applied.

The I/O edge of the adapter. Everything it decides, it asks the policy: the
carve-outs are raised before any RPC, the decode leg is built by the leg
builders, and the handoff is checked before the decode request is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import grpc
from pd_policy import (
    DecodeCandidate,
    WorkerCapability,
    WorkerStreamError,
    select_decode_workers,
)

from .kv import KvConnectorMode, ensure_kv_handoff, prefill_leg, relay_kv
from .legs import build_decode_leg
from .status import error_from_rpc
from .view import request_view
from .wire import pb, pb_grpc

__all__ = ["SequentialPd"]


class SequentialPd:
    """Serve ``GenerateRequest`` messages through a prefill worker and a decode worker.

    ``decode`` is either one decode channel, with ``decode_worker`` its
    advertised capability (for example :func:`pd_policy_grpc.capability_from_info`
    of its info responses), or several :class:`pd_policy.DecodeCandidate` whose
    handles are channels, in the caller's order of preference. ``kv_mode`` is
    the prefill worker's connector mode.

    :meth:`generate`:

    1. picks the first decode candidate that can serve the request
       (:func:`pd_policy.select_decode_workers`: a language-model-only worker is
       never picked for a request it cannot serve while a capable one is
       listed), decides the decode form and builds the decode leg. When no
       candidate can serve it, the carve-out raises its 400 before any request
       is sent;
    2. runs the sanitised prefill leg and waits for its ``GenerateComplete``;
    3. relays the KV parameters it returned (n<=1);
    4. checks the handoff: a stripped multimodal leg without one raises the 502;
    5. streams the decode leg's responses.

    Errors come out typed, as :class:`~pd_policy.PolicyError`: the policy's own,
    a policy error a worker returned (read from its trailing metadata), or a
    worker's failure naming its leg (``prefill_worker_failed_to_start``,
    ``decode_worker_failed_to_start``, ``*_stream_error``) with its gRPC status
    mapped to HTTP. On any error, and when the caller cancels or stops iterating,
    both legs are aborted.
    """

    def __init__(
        self,
        prefill: grpc.aio.Channel,
        decode: grpc.aio.Channel | Sequence[DecodeCandidate[grpc.aio.Channel]],
        decode_worker: WorkerCapability | None = None,
        *,
        kv_mode: KvConnectorMode = KvConnectorMode.NIXL,
        timeout: float | None = None,
        abort_timeout: float = 2.0,
    ) -> None:
        self._prefill = pb_grpc.VllmEngineStub(prefill)
        if isinstance(decode, Sequence):
            if decode_worker is not None:
                raise TypeError("decode_worker goes with a single decode channel")
            self.candidates = list(decode)
        else:
            if decode_worker is None:
                raise TypeError("a single decode channel needs its decode_worker capability")
            self.candidates = [DecodeCandidate(decode_worker, decode)]
        self._stubs = {id(c.handle): pb_grpc.VllmEngineStub(c.handle) for c in self.candidates}
        self.kv_mode = kv_mode
        self.timeout = timeout
        self.abort_timeout = abort_timeout

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        """Serve ``request``; yields the decode worker's responses. See the class docs."""
        chosen = self.choose(request)
        decode = self._stubs[id(chosen.handle)]
        # Choosing among several candidates already checked the message.
        form, leg = build_decode_leg(request, chosen.worker, check=len(self.candidates) == 1)
        finished = False
        try:
            complete = await self._prefill_complete(prefill_leg(request, self.kv_mode))
            relay_kv(leg, complete)
            ensure_kv_handoff(request, form, leg)
            async for response in self._stream_decode(decode, leg):
                yield response
            finished = True
        finally:
            if not finished:
                # Covers policy errors, worker failures, cancellation and a caller
                # that stopped iterating (GeneratorExit): neither leg may linger.
                await self._abort_both(request.request_id, decode)

    def choose(self, request: pb.GenerateRequest) -> DecodeCandidate[grpc.aio.Channel]:
        """The decode candidate :meth:`generate` would use for ``request``.

        Raises :class:`~pd_policy.MalformedRequest` and, when no candidate can
        serve it, the carve-out that explains why.
        """
        if len(self.candidates) == 1:
            return self.candidates[0]  # build_decode_leg decides and refuses for it
        return select_decode_workers(request_view(request), self.candidates)[0]

    async def _prefill_complete(self, leg: pb.GenerateRequest) -> pb.GenerateComplete:
        started = False
        complete: pb.GenerateComplete | None = None
        call = self._prefill.Generate(leg, timeout=self.timeout)
        try:
            async for response in call:
                started = True
                if response.HasField("complete"):
                    complete = response.complete
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, "prefill", started=started) from exc
        if complete is None:
            raise WorkerStreamError("prefill", "INTERNAL", "the stream ended without a completion")
        return complete

    async def _stream_decode(
        self, decode: pb_grpc.VllmEngineStub, leg: pb.GenerateRequest
    ) -> AsyncIterator[pb.GenerateResponse]:
        started = False
        call = decode.Generate(leg, timeout=self.timeout)
        try:
            async for response in call:
                started = True
                yield response
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, "decode", started=started) from exc
        finally:
            call.cancel()

    async def _abort_both(self, request_id: str, decode: pb_grpc.VllmEngineStub) -> None:
        abort = pb.AbortRequest(request_ids=[request_id])

        async def one(stub: pb_grpc.VllmEngineStub) -> None:
            # Best effort: the worker may be the reason we are aborting.
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
                await stub.Abort(abort, timeout=self.abort_timeout)

        await asyncio.gather(one(self._prefill), one(decode))

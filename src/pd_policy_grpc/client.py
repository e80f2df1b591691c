"""``SequentialPd``: one sequential P/D request over ``grpc.aio``, with the policy applied.

The I/O edge of the adapter. Everything it decides, it asks the policy: the
carve-outs are raised before any RPC, the KV handoff is planned by the core,
the decode leg is built by the leg builders, and the handoff is checked before
the decode request is sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import grpc
from pd_policy import (
    DecodeCandidate,
    KvConnectorMode,
    PrefillKv,
    WorkerCapability,
    WorkerStreamError,
    plan_kv_handoff,
    select_decode_workers,
)

from .kv import apply_kv_handoff, ensure_kv_handoff, prefill_leg, relay_kv
from .legs import build_decode_leg
from .status import error_from_rpc
from .view import request_view
from .wire import pb, pb_grpc

__all__ = ["SequentialPd"]

logger = logging.getLogger(__name__)


class SequentialPd:
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

    def __init__(
        self,
        prefill: grpc.aio.Channel,
        decode: grpc.aio.Channel | Sequence[DecodeCandidate[grpc.aio.Channel]],
        decode_worker: WorkerCapability | None = None,
        *,
        kv: PrefillKv | KvConnectorMode = KvConnectorMode.NIXL,
        timeout: float | None = None,
        abort_timeout: float = 2.0,
        deferred_abort_max_wait: float = 30.0,
    ) -> None:
        self.kv = kv if isinstance(kv, PrefillKv) else PrefillKv(kv)
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
        self.timeout = timeout
        self.abort_timeout = abort_timeout
        self.deferred_abort_max_wait = deferred_abort_max_wait
        self._deferred: set[asyncio.Task[None]] = set()
        if self.kv.mode is KvConnectorMode.PASSTHROUGH and any(
            c.worker.language_model_only for c in self.candidates
        ):
            logger.warning(
                "the prefill worker's connector is passthrough: a multimodal request sent to a "
                "language-model-only decode worker is refused (502) unless the prefill engine "
                "returns KV transfer parameters"
            )

    async def generate(self, request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        """Serve ``request``; yields the decode worker's responses. See the class docs."""
        chosen = self.choose(request)
        decode = self._stubs[id(chosen.handle)]
        # Choosing among several candidates already checked the message.
        form, leg = build_decode_leg(request, chosen.worker, check=len(self.candidates) == 1)
        handoff = plan_kv_handoff(self.kv, n=request.sampling_params.n)
        apply_kv_handoff(leg, handoff)
        if handoff.runs_prefill:
            complete = await self._run_prefill(prefill_leg(request, handoff))
            if handoff.relays:
                relay_kv(leg, complete)
        ensure_kv_handoff(request, form, leg)
        # aclosing: a caller that stops iterating closes the decode stream now, not at
        # garbage collection, so its abort goes out while the channel is open.
        async with contextlib.aclosing(self._stream_decode(decode, leg)) as stream:
            async for response in stream:
                yield response

    def choose(self, request: pb.GenerateRequest) -> DecodeCandidate[grpc.aio.Channel]:
        """The decode candidate [`generate`][pd_policy_grpc.client.SequentialPd.generate] would use
        for ``request``.

        Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] and, when no candidate can
        serve it, the carve-out that explains why.
        """
        if len(self.candidates) == 1:
            return self.candidates[0]  # build_decode_leg decides and refuses for it
        return select_decode_workers(request_view(request), self.candidates)[0]

    async def aclose(self) -> None:
        """Wait for the deferred decode aborts still pending."""
        while self._deferred:
            await asyncio.gather(*self._deferred, return_exceptions=True)

    async def _run_prefill(self, leg: pb.GenerateRequest) -> pb.GenerateComplete:
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
        finally:
            if complete is None:
                # Failed, cancelled or dropped before completing: nothing was handed off yet.
                call.cancel()
                await self._abort(self._prefill, leg.request_id)
        if complete is None:
            raise WorkerStreamError("prefill", "INTERNAL", "the stream ended without a completion")
        return complete

    async def _stream_decode(
        self, decode: pb_grpc.VllmEngineStub, leg: pb.GenerateRequest
    ) -> AsyncGenerator[pb.GenerateResponse]:
        call = decode.Generate(leg, timeout=self.timeout)
        # The first read runs in a task of its own, so that a caller cancelled while
        # waiting for it does not cancel the call mid-handoff (see the class docs).
        first: asyncio.Future[Any] = asyncio.ensure_future(call.read())
        saw_item = ended = False
        try:
            try:
                response = await asyncio.shield(first)
                while response is not grpc.aio.EOF:
                    saw_item = True
                    yield response
                    response = await call.read()
            except grpc.aio.AioRpcError as exc:
                raise error_from_rpc(exc, "decode", started=saw_item) from exc
            ended = True
        finally:
            if not ended:
                if first.done():
                    call.cancel()
                    await self._abort(decode, leg.request_id)
                else:
                    self._defer_abort(call, first, decode, leg.request_id)

    def _defer_abort(
        self,
        call: Any,
        first: asyncio.Future[Any],
        stub: pb_grpc.VllmEngineStub,
        request_id: str,
    ) -> None:
        async def abort_after_first_response() -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(first, self.deferred_abort_max_wait)
            call.cancel()
            await self._abort(stub, request_id)

        task = asyncio.get_running_loop().create_task(abort_after_first_response())
        self._deferred.add(task)
        task.add_done_callback(self._deferred.discard)

    async def _abort(self, stub: pb_grpc.VllmEngineStub, request_id: str) -> None:
        # Best effort: the worker may be the reason we are aborting.
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await stub.Abort(pb.AbortRequest(request_ids=[request_id]), timeout=self.abort_timeout)

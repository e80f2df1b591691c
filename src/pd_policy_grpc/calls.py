"""The calls of sequential P/D, shared by the routers on messages and on bytes.

What a leg is made of differs between them; how its calls are made does not: the
prefill call and its completion, the decode stream, and the aborts that settle
every leg a request started (see [`SequentialPd`][pd_policy_grpc.client.SequentialPd]).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Sequence
from typing import Any, ClassVar, Protocol

import grpc
from pd_policy import (
    DecodeCandidate,
    InvalidConfiguration,
    KvConnectorMode,
    PrefillKv,
    WorkerCapability,
    WorkerFailedToStart,
    WorkerStreamError,
)
from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS
from pd_policy_grpc.owned import router_request_id
from pd_policy_grpc.status import error_from_rpc
from pd_policy_grpc.wire import pb, pb_grpc

__all__ = ["PdCalls", "Stub", "checked_max_media_items"]

logger = logging.getLogger("pd_policy_grpc.client")


def checked_max_media_items(value: int) -> int:
    """``value``, a router's cap on the media items of a request; raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] unless it is an
    integer of at least 0 (0: a router for text alone)."""
    if type(value) is not int or value < 0:
        raise InvalidConfiguration(
            "max_media_items must be an integer of at least 0", param="max_media_items"
        )
    return value


def _closed_under(leg: str, started: bool) -> WorkerFailedToStart:
    # The channel closed under the call (its member removed, the router shutting down):
    # the worker is gone for this request, as an unavailable one is.
    cls = WorkerStreamError if started else WorkerFailedToStart
    return cls(leg, "UNAVAILABLE", "the channel to the worker closed under the call")


def _cancelled_by_us() -> bool:
    # A call gRPC cancels (its channel closed) raises CancelledError into a task nobody
    # cancelled; a caller's cancel, or a deadline, is a cancel of the task itself.
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


#: A leg's gRPC metadata: the caller's trace context.
Metadata = tuple[tuple[str, str], ...]


class Stub(Protocol):
    """The two methods of the engine service a router calls."""

    Generate: Any
    Abort: Any


class PdCalls:
    """The channels, the decode candidates and the calls of a sequential P/D router.

    Subclasses say how a channel becomes a [`Stub`][pd_policy_grpc.calls.Stub]
    (``_stub``) and how a prefill response is read (``_prefill_response``).
    """

    _stub: ClassVar[Any] = pb_grpc.VllmEngineStub

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
        max_media_items: int = DEFAULT_MAX_MEDIA_ITEMS,
    ) -> None:
        self.max_media_items = checked_max_media_items(max_media_items)
        self.kv = kv if isinstance(kv, PrefillKv) else PrefillKv(kv)
        self._prefill = self._stub(prefill)
        if isinstance(decode, Sequence):
            if decode_worker is not None:
                raise TypeError("decode_worker goes with a single decode channel")
            self.candidates = list(decode)
        else:
            if decode_worker is None:
                raise TypeError("a single decode channel needs its decode_worker capability")
            self.candidates = [DecodeCandidate(decode_worker, decode)]
        self._stubs = {id(c.handle): self._stub(c.handle) for c in self.candidates}
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

    def own(self, placement: Any) -> Any:
        """The pair an attempt goes to, for a router of one pair: itself."""
        return self

    @staticmethod
    def _request_id(caller_id: str) -> str:
        """A new id for an attempt's legs (the router's own); the caller's goes to the log."""
        own = router_request_id()
        # Bounded, and as a repr: the caller chose it, newlines and all.
        logger.debug("request %.80r runs as %s", caller_id, own)
        return own

    @staticmethod
    def _prefill_response(item: Any) -> pb.GenerateResponse:
        """A prefill response as the channel yields it, read."""
        return item  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        """Wait for the deferred decode aborts still pending."""
        while self._deferred:
            await asyncio.gather(*self._deferred, return_exceptions=True)

    async def _run_prefill(
        self, leg: Any, request_id: str, metadata: Metadata = ()
    ) -> pb.GenerateComplete:
        started = False
        complete: pb.GenerateComplete | None = None
        try:
            call = self._prefill.Generate(leg, timeout=self.timeout, metadata=metadata or None)
        except grpc.aio.UsageError:
            raise _closed_under("prefill", False) from None
        try:
            async for item in call:
                started = True
                response = self._prefill_response(item)
                if response.HasField("complete"):
                    complete = response.complete
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, "prefill", started=started) from exc
        except grpc.aio.UsageError:
            raise _closed_under("prefill", started) from None
        except asyncio.CancelledError:
            if _cancelled_by_us():
                raise
            raise _closed_under("prefill", started) from None
        finally:
            if complete is None:
                # Failed, cancelled or dropped before completing: nothing was handed off yet.
                call.cancel()
                await self._abort(self._prefill, request_id)
        if complete is None:
            raise WorkerStreamError("prefill", "INTERNAL", "the stream ended without a completion")
        return complete

    async def _stream_decode(
        self, decode: Stub, leg: Any, request_id: str, metadata: Metadata = ()
    ) -> AsyncGenerator[Any]:
        try:
            call = decode.Generate(leg, timeout=self.timeout, metadata=metadata or None)
        except grpc.aio.UsageError:
            raise _closed_under("decode", False) from None
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
            except grpc.aio.UsageError:
                raise _closed_under("decode", saw_item) from None
            except asyncio.CancelledError:
                if _cancelled_by_us():
                    raise
                raise _closed_under("decode", saw_item) from None
            ended = True
        finally:
            if not ended:
                if first.done():
                    call.cancel()
                    await self._abort(decode, request_id)
                else:
                    self._defer_abort(call, first, decode, request_id)

    def _defer_abort(
        self,
        call: Any,
        first: asyncio.Future[Any],
        stub: Stub,
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

    async def _abort(self, stub: Stub, request_id: str) -> None:
        # Best effort: the worker may be the reason we are aborting.
        # A closed channel (the member was removed under the request) has nothing to abort.
        with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.TimeoutError):
            await stub.Abort(pb.AbortRequest(request_ids=[request_id]), timeout=self.abort_timeout)

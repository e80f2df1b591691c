"""Loopback engines that misbehave on request, and keep a ledger of every leg they see.

A test gives an engine a :class:`Fault` per caller's request id (``engine.faults[rid]``);
requests without one are served as :mod:`engines` serves them. The ledger
records, by the caller's id, every ``Generate`` that started, every one whose stream
the engine finished (its last item sent), every ``Abort``, and the number of
``Generate`` streams still open on the server. It keeps ids only, never the
messages, so that a load test can measure its own memory.

A router runs every leg under an id of its own, never the caller's: the caller's id
reaches the engine only as :func:`tag` wrote it into the request (a field the router
forwards as it is), and the ledger learns each leg's own id from it, for the aborts.

* :class:`FaultyPrefill` is a vision prefill (``NixlConnector``) that answers
  with one ``GenerateComplete`` naming the transfer :func:`kv_json` describes.
* :class:`FaultyDecode` is a ``--language-model-only`` decode: it refuses
  media like :class:`engines.LanguageModelOnlyDecodeEngine` and streams
  :func:`engines.answer` of its leg, one token per chunk, then the completion.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from engines import Engine, answer, refuse_media

import grpc
from pd_policy_grpc.wire import pb

__all__ = ["Fault", "FaultyDecode", "FaultyPrefill", "caller_of", "kv_json", "tag"]

_TAG = "caller:"


class Fault(enum.Enum):
    """What an engine does to one request instead of serving it."""

    #: Aborts the RPC with ``fault_status`` before sending anything.
    DIE_BEFORE_OUTPUT = "die-before-output"
    #: Sends one chunk, then aborts the RPC with ``fault_status``.
    DIE_AFTER_OUTPUT = "die-after-output"
    #: Sends one chunk, then ends the stream (status OK) without a completion.
    CLOSE_EARLY = "close-early"
    #: The handler raises after one chunk: gRPC answers ``UNKNOWN``.
    CRASH = "crash"
    #: Waits for ``release`` before sending anything.
    HOLD_FIRST = "hold-first"
    #: Sends one chunk, then waits for ``release``.
    HOLD_LAST = "hold-last"


def tag(request: pb.GenerateRequest) -> pb.GenerateRequest:
    """``request`` (tokenized) carrying its caller's id where :func:`caller_of` reads it."""
    request.tokenized.original_text = _TAG + request.request_id
    return request


def caller_of(leg: pb.GenerateRequest) -> str:
    """The caller's id a leg carries (:func:`tag`); its own id when untagged."""
    text = leg.tokenized.original_text
    return text[len(_TAG) :] if text.startswith(_TAG) else leg.request_id


def kv_json(request_id: str) -> str:
    """The ``kv_transfer_params_json`` :class:`FaultyPrefill` returns for ``request_id``."""
    return json.dumps(
        {"do_remote_prefill": True, "do_remote_decode": False,
         "transfer_id": f"xfer-{request_id}", "remote_engine_id": "prefill-0",
         "remote_block_ids": [0, 1], "remote_host": "prefill-0.local", "remote_port": 5600}
    )  # fmt: skip


class _Ledger(Engine):
    """An engine that keeps a ledger of its legs and applies :class:`Fault` by request id."""

    def __init__(self, *, supports_vision: bool, kv_connector: str = "") -> None:
        super().__init__(supports_vision=supports_vision, kv_connector=kv_connector)
        self.faults: dict[str, Fault] = {}
        self.fault_status = grpc.StatusCode.INTERNAL
        self.started: list[str] = []
        self.completed: list[str] = []
        self.open_streams = 0
        self.holding: set[str] = set()
        self._held = asyncio.Condition()
        #: The caller's id of each leg, by the id it ran under.
        self.callers: dict[str, str] = {}

    def clear(self) -> None:
        """Forget the ledger and the faults (not the streams still open)."""
        self.faults.clear()
        self.started.clear()
        self.completed.clear()
        self.aborted.clear()
        self.requests.clear()
        self.release.clear()
        self.callers.clear()

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:  # noqa: N802
        self.aborted.extend(self.callers.get(own, own) for own in request.request_ids)
        return pb.AbortResponse()

    async def until_holding(self, count: int) -> None:
        """Return once ``count`` streams are waiting for ``release`` (at most 30 s)."""
        async with asyncio.timeout(30), self._held:
            await self._held.wait_for(lambda: len(self.holding) >= count)

    def unsettled(self) -> set[str]:
        """Legs that started here and were neither completed nor aborted."""
        return set(self.started) - set(self.completed) - set(self.aborted)

    async def Generate(  # noqa: N802 (the proto's RPC name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        rid = self.callers[request.request_id] = caller_of(request)
        self.started.append(rid)
        self.open_streams += 1
        try:
            fault = self.faults.get(rid)
            await self.refuse(request, context)
            if fault is Fault.DIE_BEFORE_OUTPUT:
                await context.abort(self.fault_status, f"{rid}: the engine died")
            if fault is Fault.HOLD_FIRST:
                await self._hold(rid)
            responses = list(self.items(request))
            for i, response in enumerate(responses):
                if i == len(responses) - 1:
                    # The engine is done with the request once it has produced its last
                    # output, whether or not the client reads it: such a leg needs no abort.
                    self.completed.append(rid)
                yield response
                if i == 0 and fault is Fault.CLOSE_EARLY:
                    return
                if i == 0:
                    await self._after_first(rid, fault, context)
        finally:
            self.open_streams -= 1

    def items(self, request: pb.GenerateRequest) -> Iterator[pb.GenerateResponse]:
        """The responses a healthy engine sends for ``request``."""
        raise NotImplementedError

    async def _after_first(self, rid: str, fault: Fault | None, context: Any) -> None:
        if fault is Fault.DIE_AFTER_OUTPUT:
            await context.abort(self.fault_status, f"{rid}: the engine died mid-stream")
        if fault is Fault.CRASH:
            raise RuntimeError(f"{rid}: the handler crashed")
        if fault is Fault.HOLD_LAST:
            await self._hold(rid)

    async def _hold(self, rid: str) -> None:
        async with self._held:
            self.holding.add(rid)
            self._held.notify_all()
        try:
            await self.release.wait()
        finally:
            self.holding.discard(rid)


class FaultyPrefill(_Ledger):
    """A vision prefill engine: a chunk-free ``GenerateComplete`` with NIXL parameters.

    A fault that sends "one chunk" first sends an empty ``GenerateStreamChunk``
    here, so the client has seen output before the fault.
    """

    def __init__(self) -> None:
        super().__init__(supports_vision=True, kv_connector="NixlConnector")

    def items(self, request: pb.GenerateRequest) -> Iterator[pb.GenerateResponse]:
        if self.faults.get(caller_of(request)) in _CHUNK_FIRST:
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[0]))
        complete = pb.GenerateComplete(output_ids=[1], finish_reason="length")
        complete.kv_transfer_params_json = kv_json(caller_of(request))
        yield pb.GenerateResponse(complete=complete)


_CHUNK_FIRST = {Fault.DIE_AFTER_OUTPUT, Fault.CLOSE_EARLY, Fault.CRASH, Fault.HOLD_LAST}


class FaultyDecode(_Ledger):
    """A ``--language-model-only`` decode engine: refuses pixels, streams :func:`answer`."""

    def __init__(self) -> None:
        super().__init__(supports_vision=False, kv_connector="NixlConnector")

    async def refuse(self, request: pb.GenerateRequest, context: Any) -> None:
        await refuse_media(request, context)

    def items(self, request: pb.GenerateRequest) -> Iterator[pb.GenerateResponse]:
        tokens = answer(request)
        for token in tokens:
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        yield pb.GenerateResponse(
            complete=pb.GenerateComplete(output_ids=tokens, finish_reason="length")
        )

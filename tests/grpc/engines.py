"""In-process engines that implement the ``smg-grpc-proto`` vLLM service, on loopback.

* :class:`PrefillEngine` answers a prefill leg with a ``GenerateComplete`` that
  names its KV transfer (or, when told, returns none, or fails).
* :class:`LanguageModelOnlyDecodeEngine` behaves like a ``--language-model-only``
  vLLM worker: it refuses any request carrying pixels, grid tensors,
  placeholders or media references with ``INVALID_ARGUMENT`` and vLLM's
  encoder-cache wording, and records every request it receives.
* :class:`FullVisionDecodeEngine` takes anything.

Decode output is a deterministic function of what the leg carries (ids, hashes
and KV parameters), so a test can tell an image-blind answer from a real one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from pd_policy_grpc.wire import pb, pb_grpc

ENCODER_CACHE_ERROR = (
    "The decoder prompt (length {n}) contains a multimodal item with 16 embeddings, which "
    "exceeds the pre-allocated encoder cache size 0. Please reduce the input size or increase "
    "the encoder cache size by setting --limit-mm-per-prompt at startup."
)


def answer(request: pb.GenerateRequest, count: int = 4) -> list[int]:
    """The tokens a decode engine produces for ``request``: a function of its identity."""
    digest = hashlib.sha256()
    digest.update(repr(list(request.tokenized.input_ids)).encode())
    for batch in [request.mm_inputs, *request.extra_mm_inputs]:
        digest.update(repr(list(batch.mm_hashes)).encode())
    digest.update(request.kv_transfer_params_json.encode())
    return list(digest.digest()[:count])


async def refuse_media(request: pb.GenerateRequest, context: Any) -> None:
    """Abort as a language-model-only vLLM worker does when a leg carries media."""
    for batch in [request.mm_inputs, *request.extra_mm_inputs]:
        if batch.HasField("pixel_values") or batch.model_specific_tensors or batch.mm_placeholders:
            n = len(request.tokenized.input_ids)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, ENCODER_CACHE_ERROR.format(n=n))
    if request.HasField("media_refs"):
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, "media_refs sent to a worker whose processor is off"
        )


def _metadata(context: Any) -> dict[str, str]:
    return {key: value for key, value in context.invocation_metadata() or ()
            if isinstance(value, str)}  # fmt: skip


class Engine(pb_grpc.VllmEngineServicer):
    """A recording engine: every Generate and Abort it receives is kept."""

    def __init__(self, *, supports_vision: bool, kv_connector: str = "") -> None:
        self.requests: list[pb.GenerateRequest] = []
        #: Each Generate call's metadata, as the engine received it.
        self.metadata: list[dict[str, str]] = []
        self.aborted: list[str] = []
        self.supports_vision = supports_vision
        self.kv_connector = kv_connector
        self.hold = asyncio.Event()  # set: streams pause before their last item
        self.hold_first = asyncio.Event()  # set: streams pause before their first item
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()  # set while a stream is paused
        self.healthy = True  # what HealthCheck answers

    async def HealthCheck(self, request: Any, context: Any) -> pb.HealthCheckResponse:
        return pb.HealthCheckResponse(healthy=self.healthy, message="test")

    async def GetModelInfo(self, request: Any, context: Any) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(model_path="tiny", supports_vision=self.supports_vision)

    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(kv_connector=self.kv_connector, kv_role="kv_both")

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:
        self.aborted.extend(request.request_ids)
        return pb.AbortResponse()

    async def refuse(self, request: pb.GenerateRequest, context: Any) -> None:
        """Refuse what this engine cannot take (nothing, by default)."""

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        self.metadata.append(_metadata(context))
        await self.refuse(request, context)
        tokens = answer(request)
        for i, token in enumerate(tokens):
            last = i == len(tokens) - 1
            if (last and self.hold.is_set()) or (i == 0 and self.hold_first.is_set()):
                self.waiting.set()
                await self.release.wait()
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        yield pb.GenerateResponse(
            complete=pb.GenerateComplete(output_ids=tokens, finish_reason="length")
        )


class PrefillEngine(Engine):
    """A vision prefill engine whose connector returns the transfer's parameters.

    ``returns`` is ``"json"`` (NIXL-style ``kv_transfer_params_json``),
    ``"legacy"`` (the typed host/port pair), ``"nothing"``, or a gRPC status
    name to fail with.
    """

    def __init__(self, returns: str = "json") -> None:
        super().__init__(supports_vision=True, kv_connector="NixlConnector")
        self.returns = returns

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        self.metadata.append(_metadata(context))
        if self.returns not in {"json", "legacy", "nothing"}:
            await context.abort(grpc.StatusCode[self.returns], "prefill engine is overloaded")
        if self.hold_first.is_set():
            self.waiting.set()
            await self.release.wait()
        complete = pb.GenerateComplete(output_ids=[1], finish_reason="length")
        if self.returns == "json":
            complete.kv_transfer_params_json = json.dumps(
                {"do_remote_prefill": True, "do_remote_decode": False,
                 "transfer_id": f"xfer-{request.request_id}", "remote_engine_id": "prefill-0",
         "remote_block_ids": [0, 1], "remote_host": "prefill-0.local", "remote_port": 5600}
            )  # fmt: skip
        elif self.returns == "legacy":
            complete.kv_transfer_params.remote_host = "prefill-0.local"
            complete.kv_transfer_params.remote_port = 7000
        yield pb.GenerateResponse(complete=complete)


class LanguageModelOnlyDecodeEngine(Engine):
    """A decode engine that runs ``--language-model-only``: no encoder, budget 0."""

    def __init__(self) -> None:
        super().__init__(supports_vision=False, kv_connector="NixlConnector")

    async def refuse(self, request: pb.GenerateRequest, context: Any) -> None:
        await refuse_media(request, context)


class FullVisionDecodeEngine(Engine):
    """A decode engine with its vision encoder: it takes anything."""

    def __init__(self) -> None:
        super().__init__(supports_vision=True)


@asynccontextmanager
async def serve_address(engine: pb_grpc.VllmEngineServicer) -> AsyncIterator[str]:
    """Serve ``engine`` on a loopback port; yields its address."""
    server = grpc.aio.server()
    pb_grpc.add_VllmEngineServicer_to_server(engine, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)


@asynccontextmanager
async def serve(engine: pb_grpc.VllmEngineServicer) -> AsyncIterator[grpc.aio.Channel]:
    """Serve ``engine`` on a loopback port; yields a channel to it."""
    async with serve_address(engine) as address, grpc.aio.insecure_channel(address) as channel:
        yield channel

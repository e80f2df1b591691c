"""Stub engines of SMG's vLLM gRPC service, for the routers benchmark: answer at once.

Run: ``python bench/grpc_stubs.py PREFILL_PORT DECODE_PORT MODEL_DIR``. The prefill
answers every leg with one ``GenerateComplete`` naming its NIXL transfer; the decode
is a language-model-only worker that refuses any leg with pixels, grids or
placeholders (as ``--language-model-only`` vLLM does) and otherwise streams a few
tokens. Both describe themselves as a real worker would to a gateway: the model
directory (SMG loads its tokenizer and image processor from it; a path that is not
local makes SMG try a model hub), vision or not, and the ``NixlConnector``.

A router that sends pixels to decode sees its call fail, and the bench counts it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from grpc_load import DecodeEngine, PrefillEngine

import grpc
from pd_policy_grpc.wire import pb, pb_grpc


class _Described:
    """What a gateway asks a worker before it routes to it."""

    model_dir = ""
    vision = True

    async def HealthCheck(self, request: Any, context: Any) -> pb.HealthCheckResponse:  # noqa: N802
        return pb.HealthCheckResponse(healthy=True, message="ok")

    async def GetModelInfo(self, request: Any, context: Any) -> pb.GetModelInfoResponse:  # noqa: N802
        return pb.GetModelInfoResponse(
            model_path=self.model_dir, tokenizer_path=self.model_dir, supports_vision=self.vision
        )

    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:  # noqa: N802
        return pb.GetServerInfoResponse(kv_connector="NixlConnector", kv_role="kv_both")


class Prefill(_Described, PrefillEngine):
    pass


class LanguageModelOnlyDecode(_Described, DecodeEngine):
    vision = False

    async def Generate(  # noqa: N802 (the proto's RPC name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        for batch in (request.mm_inputs, *request.extra_mm_inputs):
            if batch.HasField("pixel_values") or batch.model_specific_tensors or (
                batch.mm_placeholders
            ):  # fmt: skip
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "exceeds the pre-allocated encoder cache size 0",
                )
        async for response in super().Generate(request, context):
            yield response


async def main(prefill_port: int, decode_port: int, model_dir: str) -> None:
    servers = []
    for engine, port in ((Prefill(), prefill_port), (LanguageModelOnlyDecode(), decode_port)):
        engine.model_dir = model_dir
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 2**30)])
        pb_grpc.add_VllmEngineServicer_to_server(engine, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        servers.append(server)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    for server in servers:
        await server.stop(grace=None)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))

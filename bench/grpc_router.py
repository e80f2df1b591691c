"""A router process for the routers benchmark: SMG's vLLM gRPC service in front, P/D behind.

Run: ``python bench/grpc_router.py PORT PREFILL DECODE {messages|bytes} [no-retries]``.
Clients call
its ``Generate`` as they would an engine's; each request goes through
``SequentialPd`` (``messages``: grpc parses the request into a message, the router
builds message legs) or ``SequentialPdBytes`` (``bytes``: a generic handler with no
serializers hands the router the request's bytes and takes the decode's responses as
bytes, so nothing is parsed that need not be), with a language-model-only decode
worker and the NIXL handoff. A policy refusal ends the call with the status and
message the error maps to.

``no-retries`` opens the worker channels with ``grpc.enable_retries`` off. gRPC then
keeps no copy of each message for a retry it would never make here (the router's
fleet retries a failed leg on another worker itself; a leg that never left is then a
503 to retry rather than a transparent retry).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any, Final

import grpc
from pd_policy import PolicyError, VisionSupport, WorkerCapability
from pd_policy_grpc import SequentialPd, grpc_status
from pd_policy_grpc.raw.client import SequentialPdBytes
from pd_policy_grpc.wire import pb, pb_grpc

LM_ONLY: Final = WorkerCapability(VisionSupport.FALSE)
_SERVICE: Final = pb.DESCRIPTOR.services_by_name["VllmEngine"].full_name
_OPTIONS: Final = [
    ("grpc.max_receive_message_length", 2**30),
    ("grpc.max_send_message_length", 2**30),
]


async def _refuse(context: grpc.aio.ServicerContext[Any, Any], exc: PolicyError) -> None:
    status = grpc_status(exc)
    await context.abort(status.code, status.details, status.trailing_metadata)


class MessageRouter(pb_grpc.VllmEngineServicer):
    def __init__(self, pd: SequentialPd) -> None:
        self.pd = pd

    async def Generate(  # noqa: N802 (the proto's RPC name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            async for response in self.pd.generate(request):
                yield response
        except PolicyError as exc:
            await _refuse(context, exc)


def bytes_handler(pd: SequentialPdBytes) -> grpc.GenericRpcHandler:
    async def generate(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            async for response in pd.generate(data):
                yield response
        except PolicyError as exc:
            await _refuse(context, exc)

    # No deserializer and no serializer: the handler gets and gives bytes.
    handler: grpc.RpcMethodHandler[Any, Any] = grpc.unary_stream_rpc_method_handler(generate)
    return grpc.method_handlers_generic_handler(_SERVICE, {"Generate": handler})


async def main(port: int, prefill: str, decode: str, kind: str, *, retries: bool) -> None:
    options = _OPTIONS if retries else [*_OPTIONS, ("grpc.enable_retries", 0)]
    prefill_channel = grpc.aio.insecure_channel(prefill, options=options)
    decode_channel = grpc.aio.insecure_channel(decode, options=options)
    server = grpc.aio.server(options=_OPTIONS)
    pd: SequentialPd | SequentialPdBytes
    if kind == "messages":
        pd = SequentialPd(prefill_channel, decode_channel, LM_ONLY)
        pb_grpc.add_VllmEngineServicer_to_server(MessageRouter(pd), server)
    elif kind == "bytes":
        pd = SequentialPdBytes(prefill_channel, decode_channel, LM_ONLY)
        server.add_generic_rpc_handlers((bytes_handler(pd),))
    else:
        raise SystemExit(f"unknown router kind {kind!r}: messages or bytes")
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=None)
    await pd.aclose()


if __name__ == "__main__":
    retries = sys.argv[5:] != ["no-retries"]
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], retries=retries))

"""docs/grpc.md's router example runs against engines on loopback."""

from __future__ import annotations

import asyncio
import json
from contextlib import AsyncExitStack

from engines import LanguageModelOnlyDecodeEngine, PrefillEngine, answer, serve_address
from proto_strategies import to_proto

from docs_examples import load_route
from pd_policy.tools.scenarios import image_request, mrope_request
from pd_policy_grpc.wire import pb


def test_the_router_example_serves_and_refuses() -> None:
    route = load_route()
    decode = LanguageModelOnlyDecodeEngine()

    async def main() -> None:
        async with AsyncExitStack() as stack:
            prefill_at = await stack.enter_async_context(serve_address(PrefillEngine()))
            decode_at = await stack.enter_async_context(serve_address(decode))
            status, tokens = await route(to_proto(image_request()), prefill_at, decode_at)
            assert status == 200
            assert tokens == answer(decode.requests[0])
            status, body = await route(to_proto(mrope_request()), prefill_at, decode_at)
            assert status == 400
            assert json.loads(body)["error"]["code"] == "pd_decode_language_model_only_mrope"
            assert len(decode.requests) == 1

    asyncio.run(main())


def test_the_bytes_router_example_serves_the_same_and_refuses() -> None:
    route_bytes = load_route("route_bytes")
    decode = LanguageModelOnlyDecodeEngine()

    async def main() -> None:
        async with AsyncExitStack() as stack:
            prefill_at = await stack.enter_async_context(serve_address(PrefillEngine()))
            decode_at = await stack.enter_async_context(serve_address(decode))
            data = to_proto(image_request()).SerializeToString()
            status, responses = await route_bytes(data, prefill_at, decode_at)
            assert status == 200
            tokens = [
                t for r in responses for t in pb.GenerateResponse.FromString(r).chunk.token_ids
            ]
            assert tokens == answer(decode.requests[0])
            mrope = to_proto(mrope_request()).SerializeToString()
            status, body = await route_bytes(mrope, prefill_at, decode_at)
            assert status == 400
            assert json.loads(body)["error"]["code"] == "pd_decode_language_model_only_mrope"
            assert len(decode.requests) == 1

    asyncio.run(main())

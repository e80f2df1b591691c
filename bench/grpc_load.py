"""What ``SequentialPd`` costs under load, next to a minimal gRPC router with no policy.

Both routers drive the same two in-process ``grpc.aio`` engines on loopback (a
prefill that answers with one ``GenerateComplete`` naming its KV transfer, a
decode that streams a few tokens), in this one process and event loop. Each
round starts N image requests at once (``pd_policy.tools.scenarios.image_request``,
with a 64 KiB inline pixel payload) through each router in turn:

- *SequentialPd* is the adapter, with a language-model-only decode worker: it
  checks the message, decides, sends the sanitised prefill leg, relays the KV
  parameters onto a decode leg without the pixels, checks the handoff and
  streams the decode;
- *minimal* is what a router without the policy does by hand: the request with a
  one-token cap to prefill, then the original request, pixels included, with the
  prefill's KV parameters copied on, to decode.

Per router: requests per second (N ÷ the round's wall time) and p50/p99
end-to-end latency (start of the call to its last response), medians over the
rounds. The ratios (SequentialPd ÷ minimal) are taken per round, the two routers
run back to back in alternating order, and their median reported: this
machine's speed drifts over minutes, and a ratio per round drifts less. Engines,
routers and client share one core's event loop, so the absolute figures are a
floor for the whole stack, not a router's alone; the ratios are what to read.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any

from measuring import percentile

import grpc
from pd_policy import Request, VisionSupport, WorkerCapability
from pd_policy.tools.scenarios import image_request
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.wire import modality_to_wire, pb, pb_grpc

LM_ONLY = WorkerCapability(VisionSupport.FALSE)
#: Inline pixel bytes per request (the HTTP proxy bench's image size).
PIXEL_BYTES = 64 * 1024
#: Tokens the decode engine streams per request, one per chunk, then its completion.
TOKENS = 4
ROUTERS = ("SequentialPd", "minimal")


# --- engines -----------------------------------------------------------------------


class _Engine(pb_grpc.VllmEngineServicer):
    """A loopback engine: acknowledges aborts (the routers send none when all goes well)."""

    async def Abort(  # noqa: N802 (the proto's RPC name)
        self, request: pb.AbortRequest, context: Any
    ) -> pb.AbortResponse:
        return pb.AbortResponse()


class PrefillEngine(_Engine):
    """Answers every leg with one ``GenerateComplete`` carrying NIXL-style KV parameters."""

    async def Generate(  # noqa: N802 (the proto's RPC name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        kv = {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "transfer_id": f"xfer-{request.request_id}",
            "remote_engine_id": "prefill-0",
            # The rest of a NIXL handoff: SequentialPd plans NIXL here.
            "remote_block_ids": [0],
            "remote_host": "127.0.0.1",
            "remote_port": 1,
        }
        complete = pb.GenerateComplete(
            output_ids=[1], finish_reason="length", kv_transfer_params_json=json.dumps(kv)
        )
        yield pb.GenerateResponse(complete=complete)


class DecodeEngine(_Engine):
    """Streams ``TOKENS`` tokens, one per chunk, then the completion; takes any leg, and
    counts the bytes of the legs it receives. A leg with ``stream`` off gets one
    completion holding every token, as vLLM's servicer answers it."""

    def __init__(self) -> None:
        self.received_bytes = 0

    async def Generate(  # noqa: N802 (the proto's RPC name)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.received_bytes += request.ByteSize()
        if request.stream:
            for token in range(TOKENS):
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[token]))
        done = pb.GenerateComplete(output_ids=range(TOKENS), finish_reason="length")
        yield pb.GenerateResponse(complete=done)


# --- requests and routers ----------------------------------------------------------


def to_wire(request: Request) -> pb.GenerateRequest:
    """``request`` (one image batch, as ``image_request`` builds it) as a wire message."""
    assert request.input_ids is not None
    msg = pb.GenerateRequest(request_id=request.request_id, stream=True)
    msg.tokenized.input_ids.extend(request.input_ids)
    msg.sampling_params.max_tokens = TOKENS
    (batch,) = request.batches
    wire = msg.mm_inputs
    wire.modality = modality_to_wire(batch.modality)
    wire.mm_hashes.extend(batch.mm_hashes)
    wire.batched_keys.extend(batch.batched_keys)
    if batch.im_token_id is not None:
        wire.im_token_id = batch.im_token_id
    if batch.pixel_values is not None:
        pixels = batch.pixel_values
        wire.pixel_values.shape.extend(pixels.shape)
        wire.pixel_values.dtype = pixels.dtype
        wire.pixel_values.inline = bytes(PIXEL_BYTES)
    for p in batch.placeholders:
        wire.mm_placeholders.add(offset=p.offset, length=p.length)
    return msg


def load(size: int, tag: str) -> list[pb.GenerateRequest]:
    return [
        to_wire(image_request(images=(f"img-{i % 7}.jpg",), request_id=f"{tag}-{i}"))
        for i in range(size)
    ]


Router = Callable[[pb.GenerateRequest], AsyncIterator[pb.GenerateResponse]]


def minimal_router(prefill: grpc.aio.Channel, decode: grpc.aio.Channel) -> Router:
    """Prefill, then decode, by hand: no check, no decision, no stripping."""
    p_stub, d_stub = pb_grpc.VllmEngineStub(prefill), pb_grpc.VllmEngineStub(decode)

    async def generate(request: pb.GenerateRequest) -> AsyncIterator[pb.GenerateResponse]:
        leg = pb.GenerateRequest()
        leg.CopyFrom(request)
        leg.sampling_params.max_tokens = 1
        complete = None
        async for response in p_stub.Generate(leg):
            if response.HasField("complete"):
                complete = response.complete
        if complete is None:
            raise RuntimeError(f"{request.request_id}: the prefill returned no completion")
        request.kv_transfer_params_json = complete.kv_transfer_params_json
        async for response in d_stub.Generate(request):
            yield response

    return generate


# --- measurement -------------------------------------------------------------------


async def _one(router: Router, request: pb.GenerateRequest) -> float:
    start = time.perf_counter()
    responses = [r async for r in router(request)]
    elapsed = time.perf_counter() - start
    if len(responses) != TOKENS + 1 or not responses[-1].HasField("complete"):
        raise RuntimeError(f"{request.request_id}: {len(responses)} responses, no completion")
    return elapsed


async def _round(router: Router, requests: list[pb.GenerateRequest]) -> dict[str, float]:
    """Start every request at once; the round's throughput and latency percentiles."""
    gc.collect()
    start = time.perf_counter()
    latencies = await asyncio.gather(*(_one(router, r) for r in requests))
    wall = time.perf_counter() - start
    return {
        "requests_per_second": len(requests) / wall,
        "p50_ms": statistics.median(latencies) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
    }


async def _measure(size: int, rounds: int) -> dict[str, Any]:
    began = time.perf_counter()
    prefill, decode = PrefillEngine(), DecodeEngine()
    async with AsyncExitStack() as stack:
        channels = []
        for engine in (prefill, decode):
            server = grpc.aio.server()
            pb_grpc.add_VllmEngineServicer_to_server(engine, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            stack.push_async_callback(server.stop, None)
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            stack.push_async_callback(channel.close)
            channels.append(channel)
        pd = SequentialPd(channels[0], channels[1], LM_ONLY)
        stack.push_async_callback(pd.aclose)
        routers: dict[str, Router] = {
            "SequentialPd": pd.generate,
            "minimal": minimal_router(channels[0], channels[1]),
        }
        leg_bytes = {}
        for name, router in routers.items():  # warm-up, and the bytes each decode leg takes
            before = decode.received_bytes
            await _round(router, load(size, f"warm-{name}"))
            leg_bytes[name] = (decode.received_bytes - before) / size
        per_round: dict[str, list[dict[str, float]]] = {name: [] for name in routers}
        for i in range(rounds):
            order = ROUTERS if i % 2 == 0 else ROUTERS[::-1]
            for name in order:
                requests = load(size, f"{name}-{i}")
                per_round[name].append(await _round(routers[name], requests))

    def median(name: str, key: str) -> float:
        return statistics.median(r[key] for r in per_round[name])

    def ratio(key: str) -> float:
        ours, minimal = per_round["SequentialPd"], per_round["minimal"]
        return statistics.median(a[key] / b[key] for a, b in zip(ours, minimal, strict=True))

    results: dict[str, Any] = {
        name: {
            "requests_per_second": median(name, "requests_per_second"),
            "p50_ms": median(name, "p50_ms"),
            "p99_ms": median(name, "p99_ms"),
            "decode_leg_bytes": leg_bytes[name],
        }
        for name in routers
    }
    results["throughput_ratio"] = ratio("requests_per_second")
    results["p99_ratio"] = ratio("p99_ms")
    results["p99_added_ms"] = statistics.median(
        a["p99_ms"] - b["p99_ms"]
        for a, b in zip(per_round["SequentialPd"], per_round["minimal"], strict=True)
    )
    results["rounds"] = per_round  # the drift between rounds is in here
    results["seconds"] = time.perf_counter() - began
    results["method"] = (
        f"{size} concurrent image requests per round ({PIXEL_BYTES // 1024} KiB of pixels, "
        f"{TOKENS} decode tokens), {rounds} rounds per router after a warm-up, "
        f"alternating order; each figure a median over the rounds, each ratio a median of "
        f"per-round ratios"
    )
    return results


def measure(quick: bool = False) -> dict[str, Any]:
    """Run the gRPC load benchmark; see the module docs."""
    size, rounds = (100, 3) if quick else (500, 7)
    return asyncio.run(_measure(size, rounds))


def table(results: dict[str, Any]) -> str:
    """The load figures, as a markdown table, with the ratios under it."""
    rows = [
        "| router | requests/s | p50 | p99 | bytes per decode leg |",
        "|---|---|---|---|---|",
    ]
    for name in ROUTERS:
        r = results[name]
        rows.append(
            f"| {name} | {r['requests_per_second']:.0f} | {r['p50_ms']:.1f} ms | "
            f"{r['p99_ms']:.1f} ms | {r['decode_leg_bytes'] / 1024:.1f} KiB |"
        )
    rows += [
        "",
        f"SequentialPd ÷ minimal: throughput {results['throughput_ratio']:.2f}, p99 latency "
        f"{results['p99_ratio']:.2f}; p99 added by SequentialPd: "
        f"{results['p99_added_ms']:+.1f} ms. {results['method']}, "
        f"{results['seconds']:.0f} s in all.",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(measure(quick="--quick" in sys.argv)))

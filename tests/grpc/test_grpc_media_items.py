"""A cap on the media items of one request, on every gRPC router, checked before any
per-item work: counted from the repeated fields' sizes on a message and from the tags on
bytes (the walk stops at the cap), the same number both ways, refused with
``pd_too_many_media_items`` (400) before any worker is called."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from engines import FullVisionDecodeEngine, PrefillEngine, serve_address
from hypothesis import given
from hypothesis import strategies as st
from proto_strategies import protos, to_proto
from scrambler import scramble

import grpc
import pd_policy_grpc.raw.items
import pd_policy_grpc.raw.reader
from fuzzing import counted, fuzz
from pd_policy import (
    InvalidConfiguration,
    MalformedRequest,
    TooManyMediaItems,
    VisionSupport,
    WorkerCapability,
)
from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS
from pd_policy.tools.scenarios import image_request, media_ref_request
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.fleet import FleetPd, describe_worker
from pd_policy_grpc.media_items import count_media_items
from pd_policy_grpc.raw import SequentialPdBytes, read_request
from pd_policy_grpc.raw.protowire import Field, fields
from pd_policy_grpc.wire import pb
from routers import sequential_pd

ROUTERS = ("message", "bytes", "fleet-message", "fleet-bytes")
VISION = WorkerCapability(VisionSupport.TRUE)


def many_images(items: int) -> pb.GenerateRequest:
    """An image request of ``items`` tiny images, one batch each (a hash, a range)."""
    msg = to_proto(image_request())
    template = pb.MultimodalInputs()
    template.CopyFrom(msg.mm_inputs)
    template.ClearField("pixel_values")
    del msg.mm_inputs.mm_hashes[1:], msg.mm_inputs.mm_placeholders[1:]
    for i in range(items - 1):
        extra = msg.extra_mm_inputs.add()
        extra.CopyFrom(template)
        extra.mm_hashes[:] = [f"{i:064x}"]
    return msg


def run(kind: str, body: Any, *, limit: int = DEFAULT_MAX_MEDIA_ITEMS) -> None:
    prefill, decode = PrefillEngine(), FullVisionDecodeEngine()

    async def main() -> None:
        async with AsyncExitStack() as stack:
            p_addr = await stack.enter_async_context(serve_address(prefill))
            d_addr = await stack.enter_async_context(serve_address(decode))
            p_channel = await stack.enter_async_context(grpc.aio.insecure_channel(p_addr))
            d_channel = await stack.enter_async_context(grpc.aio.insecure_channel(d_addr))
            pair = SequentialPdBytes if kind.endswith("bytes") else SequentialPd
            router: Any
            if kind.startswith("fleet"):
                router = FleetPd(router=pair, max_media_items=limit)
                router.add("prefill", await describe_worker(p_channel, p_addr, "prefill"))
                router.add("decode", await describe_worker(d_channel, d_addr, "decode"))
            else:
                router = pair(p_channel, d_channel, VISION, max_media_items=limit)

            async def serve(msg: pb.GenerateRequest) -> list[Any]:
                data: Any = msg.SerializeToString() if kind.endswith("bytes") else msg
                return [r async for r in router.generate(data)]

            await body(serve, prefill, decode)
            await router.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ROUTERS)
def test_one_item_past_the_cap_is_refused_before_any_worker(kind: str) -> None:
    async def body(serve: Any, p: PrefillEngine, d: FullVisionDecodeEngine) -> None:
        await serve(many_images(DEFAULT_MAX_MEDIA_ITEMS))  # at the cap: served
        assert len(p.requests) == 1 and len(d.requests) == 1
        with pytest.raises(TooManyMediaItems) as caught:
            await serve(many_images(DEFAULT_MAX_MEDIA_ITEMS + 1))
        assert (caught.value.status, caught.value.code) == (400, "pd_too_many_media_items")
        assert len(p.requests) == 1 and len(d.requests) == 1  # no worker called again

    run(kind, body)


@pytest.mark.parametrize("kind", ROUTERS)
def test_the_cap_comes_before_any_per_item_work(kind: str) -> None:
    # An item that per-item work refuses (an empty content hash): under the cap it is
    # refused as such; past it, the count alone refuses the request, the item unread.
    def bad(items: int) -> pb.GenerateRequest:
        msg = many_images(items)
        msg.extra_mm_inputs[-1].mm_hashes[:] = [""]
        return msg

    async def body(serve: Any, p: PrefillEngine, d: FullVisionDecodeEngine) -> None:
        with pytest.raises(MalformedRequest):
            await serve(bad(3))
        with pytest.raises(TooManyMediaItems):
            await serve(bad(4))
        assert p.requests == [] and d.requests == []

    run(kind, body, limit=3)


@pytest.mark.parametrize("kind", ROUTERS)
def test_media_references_count_and_a_zero_cap_takes_text_alone(kind: str) -> None:
    async def body(serve: Any, p: PrefillEngine, d: FullVisionDecodeEngine) -> None:
        with pytest.raises(TooManyMediaItems):
            await serve(to_proto(media_ref_request()))
        with pytest.raises(TooManyMediaItems):
            await serve(to_proto(image_request()))
        assert p.requests == [] and d.requests == []

    run(kind, body, limit=0)


@pytest.mark.parametrize("value", [-1, 1.5, True, "128"])
def test_the_cap_is_a_count(value: Any) -> None:
    with pytest.raises(InvalidConfiguration) as caught:
        sequential_pd(None, None, VISION, max_media_items=value)
    assert caught.value.param == "max_media_items"
    with pytest.raises(InvalidConfiguration):
        FleetPd(max_media_items=value)


def _true_count(msg: pb.GenerateRequest) -> int:
    batches = ([msg.mm_inputs] if msg.HasField("mm_inputs") else []) + list(msg.extra_mm_inputs)
    refs = len(msg.media_refs.items) if msg.HasField("media_refs") else 0
    return refs + sum(max(1, len(b.mm_hashes), len(b.mm_placeholders)) for b in batches)


@fuzz
@given(protos(), st.integers(0, 2**32 - 1), st.integers(0, 6))
@counted
def test_the_count_on_bytes_is_the_count_on_the_message(
    msg: pb.GenerateRequest, seed: int, limit: int
) -> None:
    # Any valid serialization (the primary batch split in occurrences that merge, fields in
    # any order): exact up to the cap, past it on both sides.
    data = scramble(pb.GenerateRequest.DESCRIPTOR, msg.SerializeToString(), random.Random(seed))
    parsed = pb.GenerateRequest.FromString(data)
    on_message = count_media_items(parsed, limit)
    true = _true_count(parsed)
    try:
        on_bytes = read_request(data, check=False, max_media_items=limit).media_items
    except TooManyMediaItems:
        assert true > limit and on_message > limit
    else:
        assert on_bytes == on_message == true <= limit


class Walked:
    """``fields``, counting what it yields."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, buf: memoryview, start: int = 0, end: int | None = None) -> Iterator[Field]:
        for field in fields(buf, start, end):
            self.count += 1
            yield field


@pytest.mark.parametrize(
    "flood",
    [
        # A hundred thousand empty extra batches: two bytes each.
        lambda: b"\x5a\x00" * 100_000,
        # One primary batch of a hundred thousand content hashes.
        lambda: pb.GenerateRequest(
            mm_inputs=pb.MultimodalInputs(mm_hashes=["a"] * 100_000)
        ).SerializeToString(),
        # A hundred thousand media references.
        lambda: pb.GenerateRequest(
            media_refs=pb.MediaRefs(items=[pb.MediaRef(url="u")] * 100_000)
        ).SerializeToString(),
    ],
    ids=["empty batches", "hashes", "references"],
)
def test_the_reader_stops_counting_at_the_cap(flood: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # The bytes are refused after the cap and a field more, however many follow: no tag
    # past them is read, and nothing is parsed.
    walked = Walked()
    monkeypatch.setattr(pd_policy_grpc.raw.reader, "fields", walked)
    monkeypatch.setattr(pd_policy_grpc.raw.items, "fields", walked)
    data = to_proto(image_request()).SerializeToString() + flood()
    with pytest.raises(TooManyMediaItems):
        read_request(data, max_media_items=8)
    assert walked.count < 64

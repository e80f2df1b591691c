"""The stand-in KV worker itself (``tests/kv_stub.py``): its cache, its events and its render
agree with each other and with what a router computes.

A router's feed (``KvFeed``, into a ``PrefixIndex``) follows the stand-in's events, and the
router names a prompt's blocks from the stand-in's render answer: after any sequence of
requests, evictions included, the index must say of every prompt what the stand-in's own
cache holds. The events are vLLM's publisher's (``ZmqEventPublisher``), in this process.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from kv_stub import KvStub, StubConfig, kv_stubs
from pd_policy.cache.kv_blocks import BlockHasher, external_hash
from pd_policy.cache.prefix_index import PrefixIndex
from pd_policy_vllm.kv_events.feed import KvFeed
from pd_policy_vllm.openai.plan.prefix import prompt_of_render

CONFIG = StubConfig(block_size=16, capacity=12, image_tokens=40)


def chat(words: str, image: bytes | None = None, salt: str | None = None) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": words}]
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 1, "stream": False,
                            "messages": [{"role": "system", "content": "you help " * 20},
                                         {"role": "user", "content": content}]}  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    return body


async def post(url: str, body: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as response:
        return response.status, await response.json()


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


@asynccontextmanager
async def fed(stub: KvStub) -> AsyncIterator[PrefixIndex]:
    """A prefix index fed from ``stub``'s events, as the proxy's feed does."""
    index = PrefixIndex()
    feed = KvFeed(index, stub.name, f"tcp://127.0.0.1:{stub.events_port}",
                  replay=f"tcp://127.0.0.1:{stub.replay_port}")  # fmt: skip
    task = asyncio.create_task(feed.run())
    try:
        yield index
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def chain(stub: KvStub, body: dict[str, Any]) -> list[int]:
    """The block hashes a router computes for ``body`` from the stand-in's render."""
    status, answer = await post(stub.url + "/v1/chat/completions/render", body)
    assert status == 200
    prompt = prompt_of_render(answer, body)
    hasher = BlockHasher(CONFIG.block_size)
    hashes = hasher.hashes(prompt.token_ids, prompt.items, cache_salt=prompt.cache_salt)
    return [external_hash(h) for h in hashes]


def test_a_repeated_request_hits_the_cache_and_the_decode_caches_nothing() -> None:
    async def run() -> None:
        async with kv_stubs(1, 1, CONFIG) as fleet:
            p0, d0 = fleet.prefills[0], fleet.decodes[0]
            # 96 tokens, six full blocks: the last one is computed again, whatever is held.
            body = {**chat("what is in it a b c d e f", b"cat"), "return_token_ids": True}
            _, first = await post(p0.url + "/v1/chat/completions", body)
            _, again = await post(p0.url + "/v1/chat/completions", body)
            tokens = len(first["prompt_token_ids"])
            assert tokens == first["usage"]["prompt_tokens"] == 96  # the image's 40 in it
            assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
            assert cached == 80 and len(p0.cache) == 6
            assert [r.cached_tokens for r in p0.records] == [0, cached]
            assert "kv_transfer_params" not in first  # not asked for
            _, decoded = await post(d0.url + "/v1/chat/completions", body)
            assert decoded["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert not d0.records and len(d0.cache) == 0

    asyncio.run(run())


def test_the_index_fed_by_its_events_agrees_with_its_cache_through_evictions() -> None:
    async def run() -> None:
        async with kv_stubs(1, 0, CONFIG) as fleet:
            p0 = fleet.prefills[0]
            bodies = [chat("one two three", b"cat"), chat("one two three", b"dog"),
                      chat("one two three", b"cat", salt="tenant-a"), chat("four " * 30),
                      chat("one two three", b"cat")]  # fmt: skip
            chains = [await chain(p0, body) for body in bodies]
            async with fed(p0) as index:
                for body in bodies:
                    await post(p0.url + "/v1/chat/completions", body)

                    def agrees() -> bool:
                        return index.held("p0") == len(p0.cache) and all(
                            index.cached(["p0"], c)["p0"] == p0.cache.hits(c, len(c))
                            for c in chains
                        )

                    await until(agrees)
                # Blocks were evicted (the cache holds 12), the last prompt's are all held.
                assert len(set().union(*chains)) > len(p0.cache) == CONFIG.capacity
                assert p0.cache.hits(chains[4], len(chains[4])) == len(chains[4])
                p0.clear()
                await until(lambda: index.held("p0") == 0)
                assert not p0.records and len(p0.cache) == 0

    asyncio.run(run())


def test_the_render_answers_as_vllm_counts_and_can_be_overridden() -> None:
    async def run() -> None:
        async with kv_stubs(1, 0, StubConfig(image_tokens=8, tensor_bytes=64)) as fleet:
            p0 = fleet.prefills[0]
            route = p0.url + "/v1/chat/completions/render"
            assert (await post(route, {}))[0] == 400  # the proxy's probe: served
            body = chat("hi", b"cat", salt="s")
            status, answer = await post(route, body)
            assert status == 200 and p0.renders == 1
            features = answer["features"]
            assert features["mm_placeholders"] == {"image": [{"offset": 44, "length": 8}]}
            assert len(base64.b64decode(features["kwargs_data"]["image"][0])) == 64
            prompt = prompt_of_render(answer, body)
            assert prompt.cache_salt == "s" and prompt.items[0].length == 8
            _, lean = await post(route, {**body, "mm_payload": "none"})
            assert lean["features"]["kwargs_data"] is None
            status, listed = await post(p0.url + "/v1/completions/render", {"prompt": [5, 6]})
            assert status == 200 and listed[0]["token_ids"] == [5, 6]
            p0.render_override = (502, {"token_ids": "not ids"})
            assert await post(route, body) == (502, {"token_ids": "not ids"})
            assert p0.renders == 4

    asyncio.run(run())

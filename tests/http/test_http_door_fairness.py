"""What the front door does with a large body costs the event loop as little as it can.

The body is read as its chunks and joined once (``read_body``). For a body at the cap
(256 MiB) that one copy took about a quarter of a second, most of it faulting fresh
memory in, on the loop every other client's request waits on; ``bytes.join`` copies
without the GIL, so it is done in a thread, the same bytes. And a body of hundreds of
thousands of small objects (issue #42's flood, refused for its count once parsed) set
off the cycle collector again and again while it was parsed: two thirds of the parse.
A parsed body is a tree, with no cycle to find, so the door parses without it.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
from typing import Any

import aiohttp
import pytest
from fleet_stands import stands

from pd_policy_vllm.http import parsing
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.wire.body import read_body
from pd_policy_vllm.openai.wire.codec import loads
from pd_policy_vllm.openai.wire.data_url import DataUrl
from pd_policy_vllm.openai.wire.skim import SKIM_MOST, skim


def _read(size: int, monkeypatch: pytest.MonkeyPatch) -> tuple[bytes, bytes, list[Any]]:
    handed: list[Any] = []
    to_thread = asyncio.to_thread

    async def recorded(fn: Any, *args: Any) -> Any:
        handed.append(fn)
        return await to_thread(fn, *args)

    monkeypatch.setattr(asyncio, "to_thread", recorded)
    sent = os.urandom(size)
    pieces = [sent[at : at + 65536] for at in range(0, size, 65536)]

    async def chunk() -> bytes:
        return pieces.pop(0) if pieces else b""

    async def whole() -> bytes:
        raise AssertionError("a declared body is read as its chunks")

    got = asyncio.run(read_body(size, chunk, whole, 64 * 2**20))
    return sent, got, handed


def test_a_large_body_is_joined_in_a_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    sent, got, handed = _read(5 * 2**20, monkeypatch)
    assert got == sent and len(handed) == 1


def test_a_small_body_is_joined_where_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    sent, got, handed = _read(2**20, monkeypatch)
    assert got == sent and handed == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_the_body_is_parsed_without_the_cycle_collector(
    monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    collecting: list[bool] = []
    for name in ("skim", "loads"):
        parse = getattr(parsing, name)

        def watched(raw: bytes, parse: Any = parse) -> Any:
            collecting.append(gc.isenabled())
            return parse(raw)

        monkeypatch.setattr(parsing, name, watched)

    async def main() -> int:
        def make(fleet: Fleet) -> Proxy:
            return Proxy(fleet=fleet, mrope=False, log_requests=False)

        async with (
            stands(1, 1, make) as (url, _, _, _),
            aiohttp.ClientSession() as session,
            session.post(url + path, json={"model": "m", "input": "hi"}) as response,
        ):
            return response.status

    assert gc.isenabled()
    asyncio.run(main())
    assert collecting == [False] and gc.isenabled()


def test_a_body_of_more_data_strings_than_skim_looks_at_is_parsed_whole() -> None:
    # Each "data: string is a step in Python: past SKIM_MOST of them (no request holds
    # so many items) the body is parsed as any other, the same value.
    long = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 8192}}
    tiny = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    for tinies, kept in ((SKIM_MOST - 1, True), (SKIM_MOST, False)):
        raw = json.dumps({"messages": [{"role": "user", "content": [long] + [tiny] * tinies}]})
        body = skim(raw.encode())
        assert body == loads(raw.encode())
        url = body["messages"][0]["content"][0]["image_url"]["url"]
        assert isinstance(url, DataUrl) is kept

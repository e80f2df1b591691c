"""A large client body is joined in a worker thread, not on the event loop.

The body is read as its chunks and joined once (``read_body``). For a body at the cap
(256 MiB) that one copy took about a quarter of a second, most of it faulting fresh
memory in, on the loop every other client's request waits on; ``bytes.join`` copies
without the GIL, so it is done in a thread, the same bytes.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest

from pd_policy_vllm.openai.wire.body import read_body


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

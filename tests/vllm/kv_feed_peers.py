"""The peers of the KV-feed tests: vLLM's own publisher (``ZmqEventPublisher``, in this
process) on ports the OS picked, a running feed, and a relay between them that drops,
spoils or holds back the messages a test names (what the publisher cannot be made to do).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import zmq
import zmq.asyncio
from vllm.distributed.kv_events import BlockStored, KVEventBatch

from kv_publisher import bound_publisher
from pd_policy_vllm.kv_events.feed import KvFeed

__all__ = ["Worker", "feeding", "relay", "stored", "until"]


def stored(*hashes: int, medium: str | None = "GPU", group: int | None = None) -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=None,
        token_ids=[1] * (16 * len(hashes)),
        block_size=16,
        lora_id=None,
        medium=medium,
        lora_name=None,
        group_idx=group,
    )


class Worker:
    """vLLM's publisher on ports the OS picked as it bound them (``kv_publisher``)."""

    def __init__(self, topic: str = "kv", *, buffer_steps: int = 10_000) -> None:
        self.topic = topic
        self.publisher, self.port, self.replay_port = bound_publisher(
            topic, buffer_steps=buffer_steps
        )

    def publish(self, *events: Any) -> None:
        self.publisher.publish(KVEventBatch(ts=time.time(), events=list(events)))

    def restart(self) -> None:
        self.publisher.shutdown()
        for _ in range(100):  # on its ports again, once the old sockets have let them go
            try:
                self.publisher, _, _ = bound_publisher(self.topic, self.port, self.replay_port)
                return
            except zmq.ZMQError:
                time.sleep(0.05)
        raise AssertionError("the publisher's ports were not released")

    @property
    def replay(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


@asynccontextmanager
async def feeding(feed: KvFeed) -> AsyncIterator[KvFeed]:
    task = asyncio.create_task(feed.run())
    try:
        await asyncio.sleep(0.3)  # the SUB socket's connection (a slow joiner)
        yield feed
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


@asynccontextmanager
async def relay(
    worker: Worker,
    spoil: Callable[[int, list[bytes]], list[bytes] | None],
    hold: frozenset[int] = frozenset(),
) -> AsyncIterator[str]:
    """A SUB-to-PUB relay in front of ``worker``'s PUB: each message, numbered from 0, as
    ``spoil`` returns it (``None``: dropped), those numbered in ``hold`` held back a
    moment (and those after them behind). Yields the relay's endpoint."""
    context = zmq.asyncio.Context.instance()
    sub, pub = context.socket(zmq.SUB), context.socket(zmq.PUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{worker.port}")
    port = pub.bind_to_random_port("tcp://127.0.0.1")

    async def run() -> None:
        count = 0
        while True:
            frames = await sub.recv_multipart()
            out = spoil(count, frames)
            if count in hold:
                await asyncio.sleep(0.5)
            count += 1
            if out is not None:
                await pub.send_multipart(out)

    task = asyncio.create_task(run())
    try:
        await asyncio.sleep(0.3)
        yield f"tcp://127.0.0.1:{port}"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        sub.close(0)
        pub.close(0)

"""One worker's KV events, subscribed to and fed in order into the prefix index.

[`KvFeed`][pd_policy_vllm.kv_events.feed.KvFeed] connects a ZeroMQ SUB socket to the
worker's publisher and feeds each batch to the index under the worker's name. When the
index finds batches missing (the PUB socket drops what a slow subscriber cannot take,
and a subscriber that joins late misses what came before), the feed asks the worker's
replay socket for them, from the first missing on, and feeds them in order; when the
worker cannot give them (no replay socket, or they left its buffer), the index forgets
the worker's blocks and reads it on from its next batch. A batch that does not decode is
counted lost in the same way. Either way the worker only counts for less than it holds
until its cache is told again: a miss, never a wrong answer.

The live copies of the batches a replay gave are stale, but a worker that restarts numbers
its batches from 0 again: a live batch numbered within the replay's but made after its
newest is the new engine's, and the worker is read anew from it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

import attrs
import zmq
import zmq.asyncio

from pd_policy.cache.prefix_index import Fed, PrefixIndex

from .wire import END_OF_REPLAY, read_batch, read_seq

__all__ = ["FeedStats", "KvFeed"]

#: The largest batch a feed takes (a worker's batch is one engine step's events).
MAX_MESSAGE: Final = 16 * 2**20


@attrs.define
class FeedStats:
    """What a feed has seen: batches applied, lost batches replayed, resyncs (its blocks
    forgotten), batches that did not decode, and the worker's clock of the last batch
    applied next to the router's when it was."""

    applied: int = 0
    replayed: int = 0
    resyncs: int = 0
    undecodable: int = 0
    last_ts: float | None = None
    last_seen: float | None = None

    def lag(self) -> float | None:
        """Seconds between the last batch's making and its arrival (clocks apart)."""
        if self.last_ts is None or self.last_seen is None:
            return None
        return self.last_seen - self.last_ts


class KvFeed:
    """The feed of worker ``name``'s events from ``endpoint`` (``tcp://host:port``) into
    ``index``; ``replay`` is its replay socket's endpoint (``None``: it has none) and
    ``topic`` its publisher's topic. ``timeout`` bounds a replay. ``on_batch`` is called
    after each batch (the proxy's metrics follow it)."""

    def __init__(
        self,
        index: PrefixIndex,
        name: str,
        endpoint: str,
        *,
        replay: str | None = None,
        topic: str = "",
        timeout: float = 2.0,
        context: zmq.asyncio.Context | None = None,
        on_batch: Callable[[str, FeedStats], None] | None = None,
    ) -> None:
        self.index, self.name, self.endpoint = index, name, endpoint
        self.replay, self.topic, self.timeout = replay, topic.encode(), timeout
        self.context = context if context is not None else zmq.asyncio.Context.instance()
        self.on_batch = on_batch
        self.stats = FeedStats()
        # The last batch a replay gave, and the newest stamp of its batches: the live
        # copies of it and those before are stale.
        self._replayed_to: int | None = None
        self._replayed_ts = 0.0

    async def run(self) -> None:
        """Read the worker's batches until cancelled: first what its replay socket still
        keeps (a router that starts after its workers learns what they cached before),
        then each batch as it is published."""
        socket = self.context.socket(zmq.SUB)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.SUBSCRIBE, self.topic)
        socket.connect(self.endpoint)
        try:
            if self.replay is not None:
                # Subscribed first, so nothing published meanwhile is lost; the index
                # takes whichever batch the replay starts from.
                self.index.resync(self.name)
                await self._replay(0)
            while True:
                frames = await socket.recv_multipart()
                await self._take(frames[1:] if len(frames) == 3 else [])
        finally:
            socket.close()

    async def _take(self, frames: list[bytes]) -> None:
        try:
            seq = read_seq(frames[0])
            ts, events = read_batch(frames[1])
        except (ValueError, IndexError):
            self.stats.undecodable += 1
            self._resync()
            return
        if self._replayed_to is not None:
            if seq <= self._replayed_to:
                if ts <= self._replayed_ts:
                    return  # published while the replay ran, and applied from it
                # Made after every batch the replay gave, under a number it gave: a new
                # engine's (its numbers start again at 0), read anew from this batch.
                self.index.resync(self.name)
            self._replayed_to = None
        fed = self.index.feed(self.name, seq, events)
        if fed == Fed.GAP:
            await self._replay(self.index.missing(self.name))
        elif fed != Fed.STALE:
            self._applied(ts)

    def _applied(self, ts: float) -> None:
        self.stats.applied += 1
        self.stats.last_ts, self.stats.last_seen = ts, time.time()
        if self.on_batch is not None:
            self.on_batch(self.name, self.stats)

    def _resync(self) -> None:
        self.stats.resyncs += 1
        self.index.resync(self.name)

    async def _replay(self, start: int | None) -> None:
        if start is None:
            return
        if self.replay is None:
            self._resync()
            return
        socket = self.context.socket(zmq.DEALER)
        socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE)
        socket.setsockopt(zmq.LINGER, 0)
        socket.connect(self.replay)
        try:
            async with asyncio.timeout(self.timeout):
                await socket.send_multipart([b"", start.to_bytes(8, "big")])
                while True:
                    frames = await socket.recv_multipart()
                    if len(frames) != 4 or frames[2] == END_OF_REPLAY:
                        break
                    seq, (ts, events) = read_seq(frames[2]), read_batch(frames[3])
                    self._replayed_to, self._replayed_ts = seq, max(ts, self._replayed_ts)
                    if self.index.feed(self.name, seq, events) == Fed.APPLIED:
                        self.stats.replayed += 1
                        self._applied(ts)
        except (TimeoutError, ValueError):
            pass
        finally:
            socket.close()
        if self.index.missing(self.name) is not None:
            self._resync()  # the worker no longer has what was lost

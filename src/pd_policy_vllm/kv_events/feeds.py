"""The feeds of a fleet's workers into one prefix index, kept as the fleet changes.

A router calls [`reconcile`][pd_policy_vllm.kv_events.feeds.Feeds.reconcile] with the
workers it routes on and where each publishes: a feed starts for a worker that is new, or
whose source changed (it was described anew as another engine), and stops for one that
left; what the index knew of a worker that left or changed is forgotten. Each feed is a
task of the running event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping

import zmq.asyncio

from pd_policy.cache.prefix_index import PrefixIndex

from .feed import FeedStats, KvFeed
from .source import KvSource

__all__ = ["Feeds", "following"]

_log = logging.getLogger(__name__)


class Feeds:
    """The feeds into ``index``, by worker name; ``on_batch`` is given to each
    ([`KvFeed`][pd_policy_vllm.kv_events.feed.KvFeed]), ``timeout`` bounds a replay."""

    def __init__(
        self,
        index: PrefixIndex,
        *,
        timeout: float = 2.0,
        on_batch: Callable[[str, FeedStats], None] | None = None,
    ) -> None:
        self.index, self.timeout, self.on_batch = index, timeout, on_batch
        self.context = zmq.asyncio.Context()
        self._running: dict[str, tuple[KvSource, KvFeed, asyncio.Task[None]]] = {}

    @property
    def sources(self) -> Mapping[str, KvSource]:
        """The source of each worker fed now."""
        return {name: source for name, (source, _, _) in self._running.items()}

    def stats(self, name: str) -> FeedStats | None:
        """What the feed of worker ``name`` has seen, if it is fed."""
        running = self._running.get(name)
        return running[1].stats if running is not None else None

    def reconcile(self, sources: Mapping[str, KvSource]) -> None:
        """Feed exactly the workers of ``sources``, each from its source."""
        for name in list(self._running):
            if sources.get(name) != self._running[name][0]:
                self._stop(name)
        for name, source in sources.items():
            if name not in self._running:
                feed = KvFeed(
                    self.index,
                    name,
                    source.endpoint,
                    replay=source.replay,
                    topic=source.topic,
                    timeout=self.timeout,
                    context=self.context,
                    on_batch=self.on_batch,
                )
                task = asyncio.get_running_loop().create_task(self._run(feed))
                self._running[name] = (source, feed, task)

    async def _run(self, feed: KvFeed) -> None:
        # A feed that fails (a socket error) is started again; meanwhile its worker's
        # blocks count for nothing, as for any worker the index cannot follow.
        while True:
            try:
                await feed.run()
            except (zmq.ZMQError, OSError) as exc:
                _log.warning("the KV events of %s failed (%s): read again", feed.name, exc)
                self.index.resync(feed.name)
                feed.stats.resyncs += 1
                await asyncio.sleep(self.timeout)

    def _stop(self, name: str) -> None:
        _, _, task = self._running.pop(name)
        task.cancel()
        self.index.forget(name)

    async def close(self) -> None:
        """Stop every feed and close their sockets."""
        tasks = [task for _, _, task in self._running.values()]
        for name in list(self._running):
            self._stop(name)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.context.term()


@contextlib.asynccontextmanager
async def following(
    feeds: Feeds, sources: Callable[[], Mapping[str, KvSource]], interval: float = 1.0
) -> AsyncIterator[Feeds]:
    """Run ``feeds`` for the duration of the block, reconciled with what ``sources`` says
    every ``interval`` seconds (a fleet's members change); closed after."""

    async def follow() -> None:
        while True:
            feeds.reconcile(sources())
            await asyncio.sleep(interval)

    task = asyncio.create_task(follow())
    try:
        yield feeds
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await feeds.close()

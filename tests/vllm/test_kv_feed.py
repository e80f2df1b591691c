"""The KV-event feed against vLLM's own publisher (``ZmqEventPublisher``, in this process).

The publisher is the real peer: its PUB socket, its replay ROUTER and its buffer. What it
cannot be made to do (lose a batch on the way, send bytes that are not a batch) comes from
a relay between it and the feed that drops or spoils the messages a test names: the replay
still goes to the publisher itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kv_feed_peers import Worker, feeding, relay, stored, until
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved

from pd_policy.cache.kv_blocks import HashAlgo
from pd_policy.cache.prefix_index import PrefixIndex
from pd_policy_vllm.kv_events.feed import KvFeed
from pd_policy_vllm.kv_events.feeds import Feeds
from pd_policy_vllm.kv_events.source import KvSource


def test_what_the_worker_cached_before_the_router_came_is_learned_from_its_replay() -> None:
    async def run() -> None:
        worker, index = Worker(), PrefixIndex()
        worker.publish(stored(1, 2, 3))
        worker.publish(BlockRemoved(block_hashes=[3], medium="GPU"))
        await asyncio.sleep(0.2)
        feed = KvFeed(
            index, "w", f"tcp://127.0.0.1:{worker.port}", replay=worker.replay, topic="kv"
        )
        async with feeding(feed):
            await until(lambda: index.cached(["w"], [1, 2, 3])["w"] == 2)
            worker.publish(stored(3, 4))
            await until(lambda: index.cached(["w"], [1, 2, 3, 4])["w"] == 4)
            worker.publish(AllBlocksCleared())
            await until(lambda: index.held("w") == 0)
        assert feed.stats.replayed == 2 and feed.stats.applied == 4
        assert feed.stats.resyncs == 0 and feed.stats.lag() is not None
        worker.publisher.shutdown()

    asyncio.run(run())


def test_another_topic_another_tier_and_another_group_say_nothing_of_the_prefix_cache() -> None:
    async def run() -> None:
        worker, index = Worker(topic="other"), PrefixIndex()
        feed = KvFeed(index, "w", f"tcp://127.0.0.1:{worker.port}", topic="kv")
        async with feeding(feed):
            worker.publish(stored(1))
            await asyncio.sleep(0.3)
            assert index.held("w") == 0 and feed.stats.applied == 0  # not its topic
        worker.publisher.shutdown()
        worker = Worker()
        feed = KvFeed(index, "w", f"tcp://127.0.0.1:{worker.port}", topic="kv")
        async with feeding(feed):
            worker.publish(stored(1, medium="CPU"), stored(2, group=1), stored(3))
            await until(lambda: feed.stats.applied == 1)
            assert index.cached(["w"], [3])["w"] == 1 and index.held("w") == 1
        worker.publisher.shutdown()

    asyncio.run(run())


def test_a_lost_batch_is_replayed_from_the_worker_and_nothing_is_counted_twice() -> None:
    async def run() -> None:
        worker, index = Worker(), PrefixIndex()
        drop_second = lambda n, frames: None if n == 1 else frames  # noqa: E731
        # The batch after the lost one is held back until the worker has published two
        # more: the replay brings those too, and their live copies, coming after it,
        # are stale (not a restart of the worker).
        async with relay(worker, drop_second, hold=frozenset({2})) as endpoint:
            feed = KvFeed(index, "w", endpoint, topic="kv")
            feed.replay = worker.replay  # the replay from the worker itself
            async with feeding(feed):
                worker.publish(stored(1))
                worker.publish(stored(2))  # lost on the way
                for block in (3, 4, 5):
                    worker.publish(stored(block))
                await until(lambda: index.cached(["w"], [1, 2, 3, 4, 5])["w"] == 5)
                await asyncio.sleep(0.3)
                worker.publish(stored(6))
                await until(lambda: feed.stats.applied == 6)
                assert index.held("w") == 6
        assert feed.stats.replayed == 4 and feed.stats.resyncs == 0
        assert index.synced("w")
        worker.publisher.shutdown()

    asyncio.run(run())


def test_without_a_replay_a_lost_batch_forgets_the_worker_until_it_is_told_again() -> None:
    async def run() -> None:
        worker, index = Worker(), PrefixIndex()
        drop_second = lambda n, frames: None if n == 1 else frames  # noqa: E731
        async with relay(worker, drop_second) as endpoint:
            feed = KvFeed(index, "w", endpoint, topic="kv")
            async with feeding(feed):
                worker.publish(stored(1))
                await until(lambda: index.held("w") == 1)
                worker.publish(stored(2))  # lost: block 2 is unknown to the router
                worker.publish(stored(3))
                await until(lambda: feed.stats.resyncs == 1)
                # Block 1 is still cached, but the router no longer knows what else is:
                # it counts nothing until the worker tells it again.
                assert index.cached(["w"], [1])["w"] == 0
                worker.publish(stored(1))
                await until(lambda: index.cached(["w"], [1])["w"] == 1)
        worker.publisher.shutdown()

    asyncio.run(run())


def test_bytes_that_are_not_a_batch_cost_what_the_worker_was_known_to_hold() -> None:
    spoiled = [
        lambda frames: [frames[0], frames[1], b"\x93\xff\x00"],  # not msgpack of a batch
        lambda frames: [frames[0], b"\x00\x01", frames[2]],  # a number of two bytes
        lambda frames: [frames[0]],  # one frame
        lambda frames: [frames[0], frames[1], frames[2][:-3]],  # cut short
    ]

    async def one(spoil: Callable[[list[bytes]], list[bytes]]) -> None:
        worker, index = Worker(), PrefixIndex()
        async with relay(worker, lambda n, f: spoil(f) if n == 1 else f) as endpoint:
            feed = KvFeed(index, "w", endpoint, topic="kv")
            async with feeding(feed):
                worker.publish(stored(1))
                await until(lambda: index.held("w") == 1)
                worker.publish(stored(2))
                await until(lambda: feed.stats.undecodable + feed.stats.resyncs >= 1)
                assert index.held("w") == 0
                worker.publish(stored(3))
                await until(lambda: index.cached(["w"], [3])["w"] == 1)
        worker.publisher.shutdown()

    async def run() -> None:
        for spoil in spoiled:
            await one(spoil)

    asyncio.run(run())


def test_a_restarted_worker_is_read_anew() -> None:
    async def run() -> None:
        worker, index = Worker(), PrefixIndex()
        feed = KvFeed(index, "w", f"tcp://127.0.0.1:{worker.port}", topic="kv")
        async with feeding(feed):
            for block in (1, 2, 3):
                worker.publish(stored(block))
            await until(lambda: index.held("w") == 3)
            worker.restart()  # a new engine: its numbers start again at 0
            await asyncio.sleep(0.5)
            worker.publish(stored(7))
            await until(lambda: index.cached(["w"], [7])["w"] == 1)
            assert index.held("w") == 1
        worker.publisher.shutdown()

    asyncio.run(run())


def test_feeds_follow_the_fleet() -> None:
    async def run() -> None:
        a, b, index = Worker(), Worker(), PrefixIndex()

        def source(worker: Worker) -> KvSource:
            return KvSource(
                f"tcp://127.0.0.1:{worker.port}", worker.replay, "kv", 16, HashAlgo.SHA256
            )

        feeds = Feeds(index)
        feeds.reconcile({"a": source(a), "b": source(b)})
        await asyncio.sleep(0.4)
        a.publish(stored(1))
        b.publish(stored(2))
        await until(lambda: index.held("a") == 1 and index.held("b") == 1)
        feeds.reconcile({"a": source(a)})  # b left: forgotten
        assert index.held("b") == 0 and set(feeds.sources) == {"a"}
        b.publish(stored(3))
        await asyncio.sleep(0.3)
        assert index.held("b") == 0
        await feeds.close()
        a.publisher.shutdown()
        b.publisher.shutdown()

    asyncio.run(run())

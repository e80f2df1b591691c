"""What a replay cannot give, and what comes after one: the feed against vLLM's own
publisher (``kv_feed_peers``), its replay buffer made small enough to lose what a test
drops on the way, and its engine restarted on its ports.

Either way the rule is the index's: a worker counts for at most what its events say it
holds now. A block the worker may have evicted in a batch the router never read is not
counted; a block an engine held before it restarted is not counted for the new one.
"""

from __future__ import annotations

import asyncio

import pytest
from kv_feed_peers import Worker, feeding, relay, stored, until
from vllm.distributed.kv_events import BlockRemoved

from pd_policy.cache.prefix_index import PrefixIndex
from pd_policy_vllm.kv_events.feed import KvFeed


def test_batches_lost_past_the_replay_buffer_count_for_nothing_until_told_again() -> None:
    async def run() -> None:
        # The worker keeps its last two batches: by the time the feed sees the gap, the
        # lost batch (which evicted block 1) has left the buffer, and the replay answers
        # from a later number.
        worker, index = Worker(buffer_steps=2), PrefixIndex()
        drop_second = lambda n, frames: None if n == 1 else frames  # noqa: E731
        async with relay(worker, drop_second, hold=frozenset({2})) as endpoint:
            feed = KvFeed(index, "w", endpoint, topic="kv")
            feed.replay = worker.replay
            async with feeding(feed):
                worker.publish(stored(1))
                await until(lambda: index.held("w") == 1)
                worker.publish(BlockRemoved(block_hashes=[1], medium="GPU"))  # lost
                for block in (3, 4, 5):
                    worker.publish(stored(block))
                await until(lambda: feed.stats.resyncs == 1)
                # Block 1 left the worker's cache in the lost batch: never counted again.
                assert index.cached(["w"], [1])["w"] == 0 and index.held("w") == 0
                assert index.synced("w") and feed.stats.replayed == 0
                worker.publish(stored(6))  # read on from the next batch
                await until(lambda: index.cached(["w"], [6])["w"] == 1)
                await asyncio.sleep(0.2)
                assert index.cached(["w"], [1])["w"] == 0 and index.held("w") == 1
        assert feed.stats.resyncs == 1
        worker.publisher.shutdown()

    asyncio.run(run())


@pytest.mark.parametrize("lost", [0, 2], ids=["new-numbers-below", "new-number-at-the-last"])
def test_a_worker_restarted_after_a_replay_is_read_anew_from_its_new_numbers(lost: int) -> None:
    async def run() -> None:
        worker, index = Worker(), PrefixIndex()
        for block in (1, 2, 3):  # batches 0 to 2, before the router came
            worker.publish(stored(block))
        await asyncio.sleep(0.2)
        # The relay drops the new engine's first ``lost`` batches: with two lost, the first
        # the feed sees is numbered as the last the replay gave.
        drop_first = lambda n, frames: None if n < lost else frames  # noqa: E731
        async with relay(worker, drop_first) as endpoint:
            feed = KvFeed(index, "w", endpoint, replay=worker.replay, topic="kv")
            async with feeding(feed):
                await until(lambda: index.held("w") == 3)  # learned from the replay
                worker.restart()  # a new engine: nothing cached, its numbers from 0 again
                await asyncio.sleep(0.5)
                for block in (7, 8, 9):  # the new engine's batches 0 to 2
                    worker.publish(stored(block))
                await until(lambda: index.cached(["w"], [9])["w"] == 1)
                worker.publish(stored(10))
                await until(lambda: index.cached(["w"], [9, 10])["w"] == 2)
                # The old engine's blocks went with it.
                assert index.cached(["w"], [1])["w"] == 0 and index.held("w") == 4 - lost
        worker.publisher.shutdown()

    asyncio.run(run())

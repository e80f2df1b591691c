"""The prefix index against a reference model of each worker's cache.

A worker's history is drawn as numbered batches of stores, removals and clears; the
reference applies them to a set. The index is fed the workers' batches interleaved in any
order, with batches lost and replayed, delivered twice, and publishers that restart; what
it says each worker holds must be what the reference holds, or nothing while it cannot
know (a lost batch not yet replayed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from pd_policy.cache.prefix_index import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Fed,
    KvEvent,
    PrefixIndex,
)

Batch = list[KvEvent]
BLOCKS = st.integers(0, 40)


@st.composite
def histories(draw: st.DrawFn) -> list[Batch]:
    """A worker's batches: each a few events over a small set of blocks."""
    event = st.one_of(
        st.builds(BlockStored, st.lists(BLOCKS, min_size=1, max_size=6)),
        st.builds(BlockRemoved, st.lists(BLOCKS, min_size=1, max_size=4)),
        st.just(AllBlocksCleared()),
    )
    weighted = st.sampled_from([0, 0, 0, 1, 1, 2]).flatmap(
        lambda k: event if k != 2 else st.builds(BlockStored, st.lists(BLOCKS, max_size=8))
    )
    return draw(st.lists(st.lists(weighted, max_size=4), min_size=1, max_size=12))


def reference(batches: Sequence[Batch]) -> set[int]:
    held: set[int] = set()
    for batch in batches:
        for event in batch:
            if isinstance(event, BlockStored):
                held |= set(event.hashes)
            elif isinstance(event, BlockRemoved):
                held -= set(event.hashes)
            else:
                held.clear()
    return held


def holds(index: PrefixIndex, worker: str, blocks: set[int]) -> set[int]:
    """The blocks of ``blocks`` (any order) the index says ``worker`` holds."""
    return {b for b in blocks if index.cached([worker], [b])[worker] == 1}


ALL = set(range(41))


@given(st.dictionaries(st.sampled_from("abc"), histories(), min_size=1), st.randoms())
def test_in_order_per_worker_any_interleaving_the_index_is_the_reference(
    workers: dict[str, list[Batch]], rng: Any
) -> None:
    index = PrefixIndex()
    queues = {name: list(enumerate(batches)) for name, batches in workers.items()}
    while any(queues.values()):
        name = rng.choice([n for n, q in queues.items() if q])
        seq, batch = queues[name].pop(0)
        assert index.feed(name, seq, batch) == Fed.APPLIED
    for name, batches in workers.items():
        assert holds(index, name, ALL) == reference(batches)
        assert index.synced(name) and index.missing(name) is None


@given(histories(), st.data())
def test_a_lost_batch_counts_nothing_until_replayed_and_then_the_index_is_whole(
    batches: list[Batch], data: st.DataObject
) -> None:
    if len(batches) < 3:
        batches = [*batches, [BlockStored([1])], [BlockStored([2])]]
    lost = data.draw(st.integers(1, len(batches) - 2), label="lost")
    index = PrefixIndex()
    for seq in range(lost):
        index.feed("w", seq, batches[seq])
    assert index.feed("w", lost + 1, batches[lost + 1]) == Fed.GAP
    assert not index.synced("w") and index.missing("w") == lost
    assert index.cached(["w"], sorted(ALL))["w"] == 0  # nothing counts while unknown
    # The replay: from the lost batch on, the one it had among them ignored.
    for seq in range(lost, len(batches)):
        index.feed("w", seq, batches[seq])
    assert index.synced("w") and holds(index, "w", ALL) == reference(batches)


@given(histories(), histories())
def test_a_restarted_publisher_is_read_anew(before: list[Batch], after: list[Batch]) -> None:
    index = PrefixIndex()
    last: Batch = [BlockStored([99])]
    for seq, batch in enumerate([*before, last]):
        index.feed("w", seq, batch)
    fed = [index.feed("w", seq, batch) for seq, batch in enumerate(after)]
    # Its first batch numbers below the last: a new publisher, its old blocks gone.
    assert fed[0] == Fed.RESTART
    assert holds(index, "w", ALL | {99}) == reference(after)


@given(histories())
def test_a_batch_delivered_twice_is_applied_once(batches: list[Batch]) -> None:
    index = PrefixIndex()
    for seq, batch in enumerate(batches):
        index.feed("w", seq, batch)
        assert index.feed("w", seq, batch) == Fed.STALE
    assert holds(index, "w", ALL) == reference(batches)


@given(histories())
def test_a_resync_forgets_and_reads_on(batches: list[Batch]) -> None:
    index = PrefixIndex()
    index.feed("w", 0, [BlockStored([7])])
    index.feed("w", 5, batches[0])  # a gap
    index.resync("w", 5)
    assert index.synced("w") and holds(index, "w", ALL) == set()
    for seq, batch in enumerate(batches, start=5):
        index.feed("w", seq, batch)
    assert holds(index, "w", ALL) == reference(batches)


@given(st.lists(st.lists(BLOCKS, min_size=1, max_size=10), max_size=20), st.integers(1, 8))
def test_no_feed_grows_a_worker_past_its_bound(stores: list[list[int]], bound: int) -> None:
    index = PrefixIndex(max_blocks=bound)
    for seq, blocks in enumerate(stores):
        index.feed("w", seq, [BlockStored(blocks)])
        assert index.held("w") <= bound
    if stores:
        note(f"held {index.held('w')}")
        assert set(stores[-1][-1:]) <= holds(index, "w", ALL)  # the newest is kept


def test_only_the_leading_run_of_a_chain_counts() -> None:
    index = PrefixIndex()
    index.feed("w", 0, [BlockStored([1, 2, 4])])
    assert index.cached(["w", "other"], [1, 2, 3, 4]) == {"w": 2, "other": 0}
    index.feed("w", 1, [BlockRemoved([1])])
    assert index.cached(["w"], [1, 2])["w"] == 0


def test_hashes_published_as_bytes_or_ints_are_one_key() -> None:
    index = PrefixIndex()
    digest = bytes(range(32))
    index.feed("w", 0, [BlockStored([digest])])
    assert index.cached(["w"], [int.from_bytes(digest[-8:], "big")])["w"] == 1


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_blocks"):
        PrefixIndex(max_blocks=0)


@given(histories(), histories(), st.data())
def test_a_replay_from_past_the_lost_batch_counts_nothing_and_a_resync_reads_on(
    batches: list[Batch], after: list[Batch], data: st.DataObject
) -> None:
    # The worker's buffer no longer holds the lost batch: its replay answers from a later
    # number. Those batches cannot be applied (what the lost one did is unknown), so the
    # worker counts nothing until the router gives up on them and reads on.
    padding: list[Batch] = [[BlockStored([b])] for b in range(4 - len(batches))]
    batches = [*batches, *padding]
    lost = data.draw(st.integers(1, len(batches) - 3), label="lost")
    index = PrefixIndex()
    for seq in range(lost):
        index.feed("w", seq, batches[seq])
    assert index.feed("w", lost + 1, batches[lost + 1]) == Fed.GAP
    start = data.draw(st.integers(lost + 1, len(batches) - 1), label="the replay's first")
    for seq in range(start, len(batches)):
        assert index.feed("w", seq, batches[seq]) == Fed.GAP
        assert not index.synced("w") and index.missing("w") == lost
        assert index.cached(["w"], sorted(ALL))["w"] == 0
    index.resync("w")
    for seq, batch in enumerate(after, start=len(batches)):
        assert index.feed("w", seq, batch) == Fed.APPLIED
    assert holds(index, "w", ALL) == reference(after)  # only what it was told since


@given(histories(), st.data())
def test_while_a_replay_is_awaited_a_batch_already_applied_is_one_it_had(
    batches: list[Batch], data: st.DataObject
) -> None:
    # Not a new publisher: the worker is waiting for the batches it lost, and a number
    # below them is one the index applied (a replay that starts early), ignored.
    padding: list[Batch] = [[BlockStored([b])] for b in range(3 - len(batches))]
    batches = [*batches, *padding]
    lost = data.draw(st.integers(1, len(batches) - 2), label="lost")
    index = PrefixIndex()
    for seq in range(lost):
        index.feed("w", seq, batches[seq])
    assert index.feed("w", lost + 1, batches[lost + 1]) == Fed.GAP
    again = data.draw(st.integers(0, lost - 1), label="again")
    assert index.feed("w", again, batches[again]) == Fed.STALE
    assert not index.synced("w") and index.missing("w") == lost
    for seq in range(lost, len(batches)):
        index.feed("w", seq, batches[seq])
    assert index.synced("w") and holds(index, "w", ALL) == reference(batches)


def test_a_worker_never_heard_from_or_forgotten_is_not_in_sync() -> None:
    # A router looks up only the workers in sync: one it knows nothing of is not.
    index = PrefixIndex()
    assert not index.synced("w") and index.missing("w") is None and index.held("w") == 0
    index.feed("w", 0, [BlockStored([1])])
    assert index.synced("w")
    index.forget("w")
    assert not index.synced("w") and index.cached(["w"], [1]) == {"w": 0}

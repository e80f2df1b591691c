"""What each worker's prefix cache holds, as its KV events tell it, and how much of a
request each worker already holds.

A vLLM worker publishes its cache as numbered batches of events: ``BlockStored`` (blocks
it cached, by hash), ``BlockRemoved`` (blocks it evicted) and ``AllBlocksCleared``. The
index keeps, per worker, the set of block hashes the events say it holds; a request's
blocks are a hash chain (each names the whole prefix up to it,
[`kv_blocks`][pd_policy.cache.kv_blocks]), so the blocks a worker holds of a request are the
leading run of the request's chain found in that worker's set
([`cached`][pd_policy.cache.prefix_index.PrefixIndex.cached]).

The index trusts its feed no further than it must. Events are hints: a wrong one can cost
a cache miss, never a wrong answer (the worker computes what it does not hold). So:

- a worker's batches must come in order, numbered one after another. A batch whose
  number skips ahead means lost events: the worker is *unsynced*, its blocks count for
  nothing, until the batches it missed are replayed in order
  ([`missing`][pd_policy.cache.prefix_index.PrefixIndex.missing] says from which) or the
  router gives up on them ([`resync`][pd_policy.cache.prefix_index.PrefixIndex.resync]: the
  blocks it knew are forgotten, and it is known again from its next batch on);
- a batch numbered below the last one is a new publisher (the worker restarted): what
  the index knew of it is forgotten, and it is read from that batch on;
- a batch numbered at or below one already applied, while the index waits for a replay,
  is one it had: ignored;
- each worker holds at most ``max_blocks`` hashes (the oldest go first), so that no
  feed can grow the router's memory without bound.

Workers are independent: their batches may interleave in any order. Nothing here reads a
clock or a socket: the adapter decodes events and reports them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs

from .kv_blocks import external_hash

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Fed",
    "KvEvent",
    "PrefixIndex",
]


def _hashes(published: Iterable[int | bytes]) -> tuple[int, ...]:
    return tuple(external_hash(block) for block in published)


@attrs.frozen(slots=True)
class BlockStored:
    """Blocks a worker cached, by hash (as published: ``int`` or ``bytes``)."""

    hashes: tuple[int, ...] = attrs.field(converter=_hashes)


@attrs.frozen(slots=True)
class BlockRemoved:
    """Blocks a worker evicted, by hash."""

    hashes: tuple[int, ...] = attrs.field(converter=_hashes)


@attrs.frozen(slots=True)
class AllBlocksCleared:
    """The worker dropped its whole prefix cache."""


#: An event of a worker's cache.
KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class Fed:
    """What a batch did to the index: ``applied``, ``stale`` (one it had, ignored),
    ``gap`` (events were lost: the worker is unsynced until a replay or a resync), or
    ``restart`` (a new publisher: the worker's blocks forgotten, this batch applied)."""

    APPLIED = "applied"
    STALE = "stale"
    GAP = "gap"
    RESTART = "restart"


@attrs.define
class _Worker:
    blocks: dict[int, None] = attrs.field(factory=dict)  # insertion-ordered: oldest first
    last: int | None = None  # the number of the last batch applied
    synced: bool = True


class PrefixIndex:
    """The blocks each worker holds, by name (see the module docs). ``max_blocks`` bounds
    the hashes kept per worker. Raises ``ValueError`` for a bound below 1."""

    def __init__(self, *, max_blocks: int = 1 << 20) -> None:
        if max_blocks < 1:
            raise ValueError("max_blocks must be at least 1")
        self.max_blocks = max_blocks
        self._workers: dict[str, _Worker] = {}

    def feed(self, worker: str, seq: int, events: Iterable[KvEvent]) -> str:
        """Apply the batch numbered ``seq`` of ``worker``'s events; what it did
        ([`Fed`][pd_policy.cache.prefix_index.Fed])."""
        state = self._workers.setdefault(worker, _Worker())
        last = state.last
        if last is not None and seq <= last:
            if state.synced:
                # A lower number from a worker in sync is a new publisher: start over.
                restarted = seq < last
                if not restarted:
                    return Fed.STALE
                state.blocks.clear()
                self._apply(state, seq, events)
                return Fed.RESTART
            return Fed.STALE  # a replay of what was already applied
        if last is not None and seq > last + 1:
            state.synced = False
            return Fed.GAP
        state.synced = True
        self._apply(state, seq, events)
        return Fed.APPLIED

    def _apply(self, state: _Worker, seq: int, events: Iterable[KvEvent]) -> None:
        blocks = state.blocks
        for event in events:
            if isinstance(event, BlockStored):
                for block in event.hashes:
                    blocks.pop(block, None)  # stored again: the newest
                    blocks[block] = None
                while len(blocks) > self.max_blocks:
                    del blocks[next(iter(blocks))]
            elif isinstance(event, BlockRemoved):
                for block in event.hashes:
                    blocks.pop(block, None)
            else:
                blocks.clear()
        state.last = seq

    def missing(self, worker: str) -> int | None:
        """The number of the first batch ``worker`` must replay to be in sync again;
        ``None`` when it is in sync (or unknown)."""
        state = self._workers.get(worker)
        if state is None or state.synced or state.last is None:
            return None
        return state.last + 1

    def resync(self, worker: str, seq: int | None = None) -> None:
        """Give up on ``worker``'s lost batches: its blocks are forgotten, and it is read
        again from batch ``seq`` on (the next that comes, when ``None``)."""
        state = self._workers.setdefault(worker, _Worker())
        state.blocks.clear()
        state.synced = True
        state.last = None if seq is None else seq - 1

    def forget(self, worker: str) -> None:
        """``worker`` left the fleet, or restarted: nothing of it is known."""
        self._workers.pop(worker, None)

    def synced(self, worker: str) -> bool:
        """Whether ``worker``'s blocks count: it published and lost no batch since."""
        state = self._workers.get(worker)
        return state is not None and state.synced

    def held(self, worker: str) -> int:
        """How many blocks the index knows ``worker`` holds."""
        state = self._workers.get(worker)
        return len(state.blocks) if state is not None else 0

    def cached(self, workers: Iterable[str], chain: Sequence[int]) -> Mapping[str, int]:
        """For each of ``workers``, how many leading blocks of ``chain`` (a request's block
        hashes, as [`external_hash`][pd_policy.cache.kv_blocks.external_hash] gives them) it
        holds: 0 for a worker out of sync or never heard from."""
        out: dict[str, int] = {}
        for name in workers:
            state = self._workers.get(name)
            count = 0
            if state is not None and state.synced:
                blocks = state.blocks
                for block in chain:
                    if block not in blocks:
                        break
                    count += 1
            out[name] = count
        return out

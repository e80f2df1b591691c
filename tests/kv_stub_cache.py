"""The stand-in KV worker's prefix cache: a bounded LRU of block hashes.

It keeps what a vLLM worker's block pool keeps, at the granularity a router sees: the
full blocks of each prompt served, by their published hash
([`external_hash`][pd_policy.cache.kv_blocks.external_hash]), at most ``capacity`` of them.
A request hits the leading run of its blocks the cache holds, short of its last token
(vLLM always computes the last token again, for its logits); when it is served, its
blocks become the most recent, head first: a vLLM worker frees a finished request's
blocks tail first, so its tail is evicted before its head, and a shared prefix outlives
the turns built on it. Pure: the bench's oracle runs the same cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from kv_stub_prompt import Prompt
from pd_policy.cache.kv_blocks import BlockHasher, external_hash

__all__ = ["BlockCache", "chain_of"]


def chain_of(hasher: BlockHasher, prompt: Prompt) -> list[int]:
    """The published hashes of ``prompt``'s full blocks, as ``hasher``'s worker names them."""
    hashes = hasher.hashes(prompt.token_ids, prompt.items, cache_salt=prompt.cache_salt)
    return [external_hash(h) for h in hashes]


class BlockCache:
    """At most ``capacity`` block hashes, least recently used first out."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("a cache holds at least one block")
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: object) -> bool:
        return block in self._blocks

    def blocks(self) -> frozenset[int]:
        """Every block held now."""
        return frozenset(self._blocks)

    def hits(self, chain: Sequence[int], limit: int) -> int:
        """How many leading blocks of ``chain`` it holds, at most ``limit``."""
        count = 0
        for block in chain[:limit]:
            if block not in self._blocks:
                break
            count += 1
        return count

    def admit(self, chain: Sequence[int]) -> list[int]:
        """Hold every block of ``chain``, head most recent; the blocks evicted for them
        (oldest first; a chain longer than the cache evicts its own tail)."""
        for block in reversed(chain):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
        evicted = []
        while len(self._blocks) > self.capacity:
            evicted.append(self._blocks.popitem(last=False)[0])
        return evicted

    def clear(self) -> None:
        """Drop every block."""
        self._blocks.clear()

"""The routing bench's offline references: the same trace and caches, simulated.

Two oracles, computed from the trace's blocks and the stand-in workers' own cache
([`BlockCache`][kv_stub_cache.BlockCache]: the same LRU, the same last-token rule):

- **pooled LRU**: one cache of the whole fleet's capacity, every request served from it
  in arrival order. No routing shares blocks better than one cache that holds each block
  once and serves every request (short of LRU's own anomalies): the bench's target
  compares the KV router's hit rate with this one;
- **perfect-knowledge greedy**: the fleet simulated (each prefill serves one request at a
  time, ``base + per_token x`` its uncached tokens), each request sent to the prefill
  whose cache holds the most of it at its arrival (known exactly, no lag), within the
  load bound the proxy applies (at most ``ceil(1.25 x mean outstanding)``, or one request
  queued behind the one it serves, ``CACHE_SLACK``), else to the
  least outstanding: what the KV router would do with perfect information. Reported
  beside the other, informative.

The same simulation with round robin gives the offered load: the bench picks the rate
at which round robin would keep the prefills busy a set share of the time.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

import attrs

from kv_stub_cache import BlockCache
from kv_stub_prompt import Prompt
from pd_policy import CACHE_SLACK

__all__ = ["Cost", "Simulated", "pooled_lru", "simulate"]

Item = tuple[Prompt, list[int]]


@attrs.frozen(slots=True)
class Cost:
    """A prefill's time: ``base`` seconds a request, ``per_token`` an uncached token."""

    base: float
    per_token: float
    block_size: int


@attrs.frozen(slots=True)
class Simulated:
    """A simulated fleet's figures: hit rate, busy seconds and requests per prefill, and
    each request's wait plus service (its latency at the prefill)."""

    hit_rate: float
    busy: tuple[float, ...]
    requests: tuple[int, ...]
    latencies: tuple[float, ...]

    @property
    def span(self) -> float:
        """The busy seconds of the whole fleet."""
        return sum(self.busy)


def _limit(prompt: Prompt, block_size: int) -> int:
    return (len(prompt.token_ids) - 1) // block_size


def pooled_lru(items: Sequence[Item], capacity: int, block_size: int) -> float:
    """The hit rate (cached tokens ÷ prompt tokens) of one LRU of ``capacity`` blocks."""
    cache, cached, total = BlockCache(capacity), 0, 0
    for prompt, chain in items:
        cached += cache.hits(chain, _limit(prompt, block_size)) * block_size
        total += len(prompt.token_ids)
        cache.admit(chain)
    return cached / total


def simulate(
    items: Sequence[Item],
    arrivals: Sequence[float],
    *,
    prefills: int,
    capacity: int,
    cost: Cost,
    policy: str,
    bound: float = 1.25,
) -> Simulated:
    """The fleet of ``prefills`` caches of ``capacity`` blocks under ``policy``
    (``round_robin`` or ``greedy``), each request arriving at its time in ``arrivals``."""
    caches = [BlockCache(capacity) for _ in range(prefills)]
    queues: list[deque[int]] = [deque() for _ in range(prefills)]
    running, outstanding = [False] * prefills, [0] * prefills
    busy, counts = [0.0] * prefills, [0] * prefills
    latencies, cached, total = [0.0] * len(items), 0, 0
    # (time, done-before-arrival, order, worker, request)
    events = [(at, 1, i, -1, i) for i, at in enumerate(arrivals)]
    heapq.heapify(events)
    order = len(items)

    def start(worker: int, now: float) -> None:
        nonlocal cached, total, order
        i = queues[worker].popleft()
        prompt, chain = items[i]
        hits = caches[worker].hits(chain, _limit(prompt, cost.block_size))
        uncached = len(prompt.token_ids) - hits * cost.block_size
        service = cost.base + cost.per_token * uncached
        cached, total = cached + hits * cost.block_size, total + len(prompt.token_ids)
        running[worker], busy[worker] = True, busy[worker] + service
        latencies[i] = now + service - arrivals[i]
        order += 1
        heapq.heappush(events, (now + service, 0, order, worker, i))

    def route(i: int) -> int:
        if policy == "round_robin":
            return i % prefills
        prompt, chain = items[i]
        held = [c.hits(chain, _limit(prompt, cost.block_size)) for c in caches]
        cap = max(math.ceil(bound * (sum(outstanding) + 1) / prefills), 1 + CACHE_SLACK)
        holders = [w for w in range(prefills) if held[w] and outstanding[w] + 1 <= cap]
        if holders:  # the proxy's rule: the most held, the least loaded, ties in turn
            best = max((held[w], -outstanding[w]) for w in holders)
            tied = [w for w in holders if (held[w], -outstanding[w]) == best]
            return tied[i % len(tied)]
        return min(range(prefills), key=lambda w: outstanding[w])

    while events:
        now, arriving, _, worker, i = heapq.heappop(events)
        if arriving:
            worker = route(i)
            outstanding[worker] += 1
            counts[worker] += 1
            queues[worker].append(i)
            if not running[worker]:
                start(worker, now)
        else:
            caches[worker].admit(items[i][1])
            outstanding[worker] -= 1
            running[worker] = False
            if queues[worker]:
                start(worker, now)
    return Simulated(cached / total, tuple(busy), tuple(counts), tuple(latencies))

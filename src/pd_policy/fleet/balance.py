"""Which worker of a fleet takes a leg: a pure function of snapshots of the workers.

The order of the rules is the contract:

1. **Compatible first.** Only a worker that can serve the leg is considered (the
   selection functions of [`selection`][pd_policy.selection] and
   [`epd`][pd_policy.epd] decide that): a worker that cannot serve a request is never
   picked while one that can is listed, however idle it is.
2. **Routable next.** Of those, only the ones whose health says so
   ([`health`][pd_policy.fleet.health]). When every compatible worker is out, the answer
   is a 503 that a client may retry, never an incompatible worker.
3. **Cache, bounded by load.** When the router knows how many of the request's leading
   KV blocks each worker holds (its prefix cache, from the worker's KV events:
   [`prefix_index`][pd_policy.cache.prefix_index]), the worker that holds the most takes it
   (the least loaded of those, then each in turn), among those whose load stays within
   the affinity's cap below, or that have fewer than ``1 + CACHE_SLACK`` requests: a
   prefix computed once is not computed again, and one hot prefix cannot flood its
   worker. The slack is what a cache hit is worth: at a low load the cap is one request
   a worker, and a holder busy with one request would lose every hit, where waiting for
   it costs less than computing the prefix again (see ``docs/routing.md``).
4. **Affinity, bounded by load.** A request with an affinity key (its media's
   identities: the prefill's prefix and encoder caches hold that media) goes to the
   first worker in the key's rendezvous order whose load stays within ``bound``
   times the fleet's mean (with this request counted), the *consistent hashing with
   bounded loads* rule: one hot image cannot overload one worker, and no worker
   ever carries more than ``ceil(bound * mean)``.
5. **Least outstanding** otherwise (ties go to the caller's order), or, with
   ``choices=2``, the less loaded of two workers the caller drew at random.

``Balance.ROUND_ROBIN`` takes each routable worker in turn in place of rules 4 and 5
(a baseline that knows nothing of media or load); the cache's rule still comes first.

Nothing here is random: the caller draws, so the choice is a pure function.
"""

from __future__ import annotations

import enum
import hashlib
import math
from collections.abc import Sequence
from typing import Any, Final, Generic, TypeVar

import attrs

from ..errors import MalformedRequest, NoWorkerAvailable

__all__ = [
    "CACHE_SLACK",
    "DEFAULT_BOUND",
    "Balance",
    "WorkerSnapshot",
    "choose",
    "rendezvous_order",
]

T = TypeVar("T")

#: The affinity bound's default: a worker takes its key's requests until it holds 25%
#: more than the fleet's mean.
DEFAULT_BOUND: Final = 1.25
#: The requests a worker holding a request's prefix may queue behind the one it serves,
#: whatever the load cap (rule 3).
CACHE_SLACK: Final = 1


class Balance(enum.Enum):
    """How load is balanced among equally good workers."""

    #: The worker with the fewest outstanding requests (exact, for one router).
    LEAST_OUTSTANDING = "least_outstanding"
    #: The less loaded of two drawn at random (for routers whose counts go stale).
    TWO_CHOICES = "two_choices"
    #: Each in turn, whatever its load or media (a baseline); a cache hit still comes first.
    ROUND_ROBIN = "round_robin"


@attrs.frozen(slots=True)
class WorkerSnapshot(Generic[T]):
    """One worker as the router sees it when it chooses: its ``name`` (stable, for the
    rendezvous order; never a URL with credentials), whether it is ``routable`` now,
    its ``outstanding`` requests, how many of the request's leading KV blocks it holds
    (``cached``), and the caller's ``handle``."""

    name: str
    handle: T
    routable: bool = True
    outstanding: int = 0
    cached: int = 0


def _hold_rank(worker: WorkerSnapshot[Any]) -> tuple[int, int]:
    # The most blocks held first, then the least loaded.
    return worker.cached, -worker.outstanding


def _score(key: str, name: str) -> bytes:
    digest = hashlib.sha256()
    for part in (key, name):
        raw = part.encode("utf-8", "surrogatepass")
        digest.update(len(raw).to_bytes(8, "big") + raw)
    return digest.digest()


def rendezvous_order(key: str, names: Sequence[str]) -> list[int]:
    """The indices of ``names`` in ``key``'s rendezvous (highest random weight) order.

    Every router computes the same order for a key, and removing a worker moves only
    the keys it held."""
    return sorted(range(len(names)), key=lambda i: _score(key, names[i]), reverse=True)


def choose(
    compatible: Sequence[WorkerSnapshot[T]],
    *,
    role: str,
    affinity: str | None = None,
    bound: float = DEFAULT_BOUND,
    balance: Balance = Balance.LEAST_OUTSTANDING,
    draws: tuple[int, int] = (0, 0),
    turn: int = 0,
) -> WorkerSnapshot[T]:
    """The worker, among ``compatible`` (the ones that can serve the leg, in the caller's
    order), that takes the leg; see the module docs for the rules.

    ``role`` names the leg's kind in the error (``prefill``, ``decode``, ``encode``).
    ``draws`` are two random integers for ``Balance.TWO_CHOICES`` (any range: they are
    taken modulo the routable count), ``turn`` the count of choices made: it takes the
    workers in turn for ``Balance.ROUND_ROBIN``, and among the cache's rule's ties.

    Raises [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable] (503, retryable)
    when no compatible worker is routable, and
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a ``bound`` below 1 or
    not a number (an infinite one puts no bound on the load).
    """
    if not bound >= 1.0:
        raise MalformedRequest("the affinity bound must be at least 1", param="bound")
    up = [w for w in compatible if w.routable]
    if not up:
        raise NoWorkerAvailable(role)
    if len(up) == 1:  # every rule below takes it: skip the hashing
        return up[0]
    # A bound of the fleet's size or more lets any worker take every request: no cap is
    # larger, and an infinite or huge one would overflow the integer.
    cap = math.ceil(min(bound, len(up)) * (sum(w.outstanding for w in up) + 1) / len(up))
    held_cap = max(cap, 1 + CACHE_SLACK)
    holders = [w for w in up if w.cached and w.outstanding + 1 <= held_cap]
    if holders:
        best = max(map(_hold_rank, holders))
        # Ties in turn: every worker holds a shared system prompt alike, and the caller's
        # order would send each such request to its first worker.
        tied = [w for w in holders if _hold_rank(w) == best]
        return tied[turn % len(tied)]
    if balance is Balance.ROUND_ROBIN:
        return up[turn % len(up)]
    if affinity is not None:
        for i in rendezvous_order(affinity, [w.name for w in up]):
            if up[i].outstanding + 1 <= cap:
                return up[i]
    if balance is Balance.TWO_CHOICES:
        a, b = up[draws[0] % len(up)], up[draws[1] % len(up)]
        return a if a.outstanding <= b.outstanding else b
    return min(up, key=lambda w: w.outstanding)

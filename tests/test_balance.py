"""Choosing a fleet's worker from snapshots: compatible first, routable next, affinity bounded
by load, then least outstanding. The bounds are checked over skewed traffic."""

from __future__ import annotations

import math
from collections import Counter

import attrs
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import (
    CACHE_SLACK,
    Balance,
    MalformedRequest,
    NoWorkerAvailable,
    WorkerSnapshot,
    choose,
    rendezvous_order,
)

names = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=8, unique=True)


@st.composite
def fleets(draw: st.DrawFn) -> list[WorkerSnapshot[int]]:
    return [
        WorkerSnapshot(name, i, draw(st.booleans() | st.just(True)), draw(st.integers(0, 20)))
        for i, name in enumerate(draw(names))
    ]


@given(fleets(), st.none() | st.text(max_size=4), st.sampled_from(list(Balance)),
       st.tuples(st.integers(0, 99), st.integers(0, 99)))  # fmt: skip
def test_the_choice_is_a_listed_routable_worker_or_a_retryable_503(
    fleet: list[WorkerSnapshot[int]], key: str | None, balance: Balance, draws: tuple[int, int]
) -> None:
    try:
        chosen = choose(fleet, role="prefill", affinity=key, balance=balance, draws=draws)
    except NoWorkerAvailable as exc:
        assert not any(w.routable for w in fleet)
        assert exc.status == 503 and exc.retryable and exc.code == "no_prefill_worker_available"
        return
    assert chosen in fleet and chosen.routable
    up = [w for w in fleet if w.routable]
    if key is None and balance is Balance.LEAST_OUTSTANDING:
        assert chosen.outstanding == min(w.outstanding for w in up)
        assert chosen is next(w for w in up if w.outstanding == chosen.outstanding)  # the order
    if key is None and balance is Balance.TWO_CHOICES and len(up) > 1:
        drawn = up[draws[0] % len(up)], up[draws[1] % len(up)]
        assert chosen in drawn and chosen.outstanding == min(w.outstanding for w in drawn)


@given(fleets(), st.text(max_size=4))
def test_affinity_holds_while_the_load_allows_it(
    fleet: list[WorkerSnapshot[int]], key: str
) -> None:
    up = [w for w in fleet if w.routable]
    if not up:
        return
    first = up[rendezvous_order(key, [w.name for w in up])[0]]
    cap = math.ceil(1.25 * (sum(w.outstanding for w in up) + 1) / len(up))
    chosen = choose(fleet, role="prefill", affinity=key)
    if first.outstanding + 1 <= cap:
        event("affinity within the bound")
        assert chosen is first
    else:
        event("affinity over the bound")
        assert chosen is not first and chosen.outstanding + 1 <= cap


# Skewed traffic: most requests share a few hot keys (one image everyone asks about).
skewed_keys = st.lists(
    st.one_of(st.just("hot"), st.just("warm"), st.text(min_size=1, max_size=3)),
    min_size=1, max_size=200,
)  # fmt: skip


@given(st.integers(1, 8), skewed_keys, st.sampled_from([1.0, 1.25, 2.0]))
def test_no_worker_ever_holds_more_than_the_bound_times_the_mean(
    workers: int, keys: list[str], bound: float
) -> None:
    load = Counter[int]()
    fleet = [WorkerSnapshot(f"w{i}", i) for i in range(workers)]
    for placed, key in enumerate(keys, start=1):
        snapshots = [WorkerSnapshot(w.name, w.handle, True, load[w.handle]) for w in fleet]
        load[choose(snapshots, role="prefill", affinity=key, bound=bound).handle] += 1
        assert max(load.values()) <= math.ceil(bound * placed / workers)
    event(f"hot share {keys.count('hot') / len(keys):.1f}")


def test_a_hot_key_stays_on_one_worker_until_it_is_full() -> None:
    fleet = [WorkerSnapshot(f"w{i}", i) for i in range(4)]
    load = Counter[int]()
    for _ in range(8):
        snapshots = [WorkerSnapshot(w.name, w.handle, True, load[w.handle]) for w in fleet]
        load[choose(snapshots, role="prefill", affinity="hot").handle] += 1
    # Alone on an idle fleet the key's first worker takes each request while it is within
    # 1.25x the mean; then the next in the key's order takes the overflow.
    assert len(load) >= 2 and max(load.values()) <= math.ceil(1.25 * 8 / 4)


@given(names, st.text(max_size=4), st.data())
def test_removing_a_worker_moves_only_the_keys_it_held(
    fleet: list[str], key: str, data: st.DataObject
) -> None:
    if len(fleet) < 2:
        return
    gone = data.draw(st.sampled_from(fleet))
    first = fleet[rendezvous_order(key, fleet)[0]]
    rest = [n for n in fleet if n != gone]
    after = rest[rendezvous_order(key, rest)[0]]
    if first != gone:
        assert after == first


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(MalformedRequest):
        choose([WorkerSnapshot("a", 0)], role="decode", bound=0.9)
    with pytest.raises(NoWorkerAvailable) as caught:
        choose([], role="encode")
    assert caught.value.code == "no_encode_worker_available"


@st.composite
def cached_fleets(draw: st.DrawFn) -> list[WorkerSnapshot[int]]:
    # Most workers hold nothing of a request; some hold a little, one may hold much.
    held = st.integers(0, 0) | st.integers(1, 3) | st.integers(4, 40)
    return [
        WorkerSnapshot(w.name, w.handle, w.routable, w.outstanding, draw(held))
        for w in draw(fleets())
    ]


@given(cached_fleets(), st.none() | st.text(max_size=4),
       st.sampled_from([Balance.LEAST_OUTSTANDING, Balance.TWO_CHOICES]),
       st.tuples(st.integers(0, 99), st.integers(0, 99)))  # fmt: skip
def test_the_holder_of_the_most_blocks_takes_it_within_the_bound(
    fleet: list[WorkerSnapshot[int]], key: str | None, balance: Balance, draws: tuple[int, int]
) -> None:
    up = [w for w in fleet if w.routable]
    if not up:
        return
    cap = math.ceil(1.25 * (sum(w.outstanding for w in up) + 1) / len(up))
    held_cap = max(cap, 1 + CACHE_SLACK)
    holders = [w for w in up if w.cached and w.outstanding + 1 <= held_cap]
    chosen = choose(fleet, role="prefill", affinity=key, balance=balance, draws=draws)
    if len(up) == 1:
        assert chosen is up[0]
        return
    if holders:
        event("a holder within the bound")
        most = max(w.cached for w in holders)
        assert chosen.cached == most and chosen.outstanding + 1 <= held_cap
        assert chosen.outstanding == min(w.outstanding for w in holders if w.cached == most)
        return
    if any(w.cached for w in up):
        event("every holder over the bound")
    else:
        event("no holder")
    # No holder within the bound: the choice is the one without the cache's counts.
    blind = [WorkerSnapshot(w.name, w.handle, w.routable, w.outstanding) for w in fleet]
    again = choose(blind, role="prefill", affinity=key, balance=balance, draws=draws)
    assert chosen.handle == again.handle


@given(st.integers(2, 8), st.integers(1, 200), st.sampled_from([1.0, 1.25, 2.0]))
def test_a_hot_prefix_never_puts_its_holder_past_the_bound(
    workers: int, requests: int, bound: float
) -> None:
    # Every request's prefix is held by the first worker, and more of it by the second:
    # they take what the bound allows (and the cache's slack), the rest spreads.
    load = Counter[int]()
    for placed in range(1, requests + 1):
        snapshots = [
            WorkerSnapshot(f"w{i}", i, True, load[i], cached=(5, 9)[i] if i < 2 else 0)
            for i in range(workers)
        ]
        load[choose(snapshots, role="prefill", bound=bound).handle] += 1
        assert max(load.values()) <= max(math.ceil(bound * placed / workers), 1 + CACHE_SLACK)
    assert load[1] >= load[0] >= max((load[i] for i in range(2, workers)), default=0) - 1


def test_round_robin_takes_each_routable_worker_in_turn_after_a_cache_hit() -> None:
    fleet = [WorkerSnapshot(f"w{i}", i, i != 2, outstanding=3 - i) for i in range(4)]
    turns = [
        choose(fleet, role="prefill", affinity="img", balance=Balance.ROUND_ROBIN, turn=t).handle
        for t in range(6)
    ]
    assert turns == [0, 1, 3, 0, 1, 3]  # whatever their load or media
    held = [attrs.evolve(w, cached=4) if w.handle == 1 else w for w in fleet]
    assert choose(held, role="prefill", balance=Balance.ROUND_ROBIN, turn=0).handle == 1

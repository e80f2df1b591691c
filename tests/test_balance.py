"""Choosing a fleet's worker from snapshots: compatible first, routable next, affinity bounded
by load, then least outstanding. The bounds are checked over skewed traffic."""

from __future__ import annotations

import math
from collections import Counter
from typing import Final

import attrs
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
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


#: Any string, lone surrogates included: the core takes any ``str`` an adapter passes it
#: (a media identity, a worker's name), relying on no adapter's check of its text.
any_text = st.text(st.characters(exclude_categories=()), max_size=4) | st.sampled_from(
    ["\ud800", "a\udfff", "\udc80\ud83d"]
)


@given(any_text, st.lists(any_text, min_size=2, max_size=5, unique=True))
def test_any_key_and_names_have_a_rendezvous_order(key: str, names: list[str]) -> None:
    order = rendezvous_order(key, names)
    assert sorted(order) == list(range(len(names)))
    fleet = [WorkerSnapshot(name, i) for i, name in enumerate(names)]
    assert choose(fleet, role="prefill", affinity=key).handle == order[0]


def test_a_bound_below_one_is_refused() -> None:
    with pytest.raises(MalformedRequest):
        choose([WorkerSnapshot("a", 0)], role="decode", bound=0.9)
    with pytest.raises(NoWorkerAvailable) as caught:
        choose([], role="encode")
    assert caught.value.code == "no_encode_worker_available"


@given(fleets(), st.floats() | st.sampled_from([math.nan, math.inf, 0.999, 1.0, 1e308]))
def test_a_bound_is_a_number_from_one_up_or_a_typed_refusal(
    fleet: list[WorkerSnapshot[int]], bound: float
) -> None:
    try:
        chosen = choose(fleet, role="prefill", affinity="img", bound=bound)
    except MalformedRequest as exc:
        event("refused")
        assert not bound >= 1.0 and exc.param == "bound"
        return
    except NoWorkerAvailable:
        assert not any(w.routable for w in fleet)
        return
    event("chosen, past every load" if bound >= len(fleet) else "chosen")
    assert bound >= 1.0 and chosen.routable
    if bound >= len(fleet):  # no cap: the key's first routable worker, however loaded
        up = [w for w in fleet if w.routable]
        assert chosen is up[rendezvous_order("img", [w.name for w in up])[0]]


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


def _blind(fleet: list[WorkerSnapshot[int]]) -> list[WorkerSnapshot[int]]:
    return [WorkerSnapshot(w.name, w.handle, w.routable, w.outstanding) for w in fleet]


@st.composite
def quiet_fleets(draw: st.DrawFn) -> list[WorkerSnapshot[int]]:
    # A quiet fleet, where the load cap is one or two requests a worker and the cache's
    # slack decides: a holder serving one or two requests among workers mostly idle, few
    # of which hold anything.
    holder = WorkerSnapshot("", 0, draw(st.booleans() | st.just(True)), draw(st.integers(1, 2)), 5)
    other = st.builds(
        WorkerSnapshot,
        st.just(""),
        st.just(0),
        st.booleans() | st.just(True),
        st.sampled_from([0, 0, 0, 0, 1, 2]),
        st.sampled_from([0, 0, 0, 0, 0, 3]),
    )
    fleet = [holder, *(draw(other) for _ in range(draw(st.integers(1, 5))))]
    order = draw(st.permutations(fleet))
    return [attrs.evolve(w, name=f"w{i}", handle=i) for i, w in enumerate(order)]


SLACK: Final = "a holder past the cap serving one: the slack"
NO_SLACK: Final = "a holder past the cap serving two: no slack"


def slack_case(fleet: list[WorkerSnapshot[int]]) -> tuple[list[WorkerSnapshot[int]], str | None]:
    """The workers the cache's rule may take, stated with its numbers (within the cap, or
    serving at most one request), and which side of the slack the fleet is on, if any."""
    up = [w for w in fleet if w.routable]
    cap = math.ceil(1.25 * (sum(w.outstanding for w in up) + 1) / max(len(up), 1))
    takers = [w for w in up if w.cached and (w.outstanding < cap or w.outstanding <= 1)]
    if len(up) < 2:
        return takers, None
    if any(w.outstanding >= cap for w in takers):
        return takers, SLACK
    if not takers and any(w.cached and w.outstanding == 2 and cap <= 2 for w in up):
        return takers, NO_SLACK
    return takers, None


@given(quiet_fleets(), st.none() | st.just("img"),
       st.sampled_from([Balance.LEAST_OUTSTANDING, Balance.TWO_CHOICES]),
       st.tuples(st.integers(0, 99), st.integers(0, 99)))  # fmt: skip
def test_a_holder_serving_one_request_takes_it_past_the_cap_and_one_serving_two_does_not(
    fleet: list[WorkerSnapshot[int]], key: str | None, balance: Balance, draws: tuple[int, int]
) -> None:
    if sum(w.routable for w in fleet) < 2:
        return
    takers, case = slack_case(fleet)
    if case is not None:
        event(case)
    chosen = choose(fleet, role="prefill", affinity=key, balance=balance, draws=draws)
    if takers:
        most = max(w.cached for w in takers)
        assert chosen in takers and chosen.cached == most
        return
    again = choose(_blind(fleet), role="prefill", affinity=key, balance=balance, draws=draws)
    assert chosen.handle == again.handle


def test_the_quiet_fleets_reach_both_sides_of_the_slack() -> None:
    # Measured, not assumed: a derandomized draw of the strategy, each side a tenth at least.
    counts = Counter[str | None]()

    @settings(max_examples=1000, database=None, derandomize=True, deadline=None,
              phases=[Phase.generate], suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(quiet_fleets())
    def draw(fleet: list[WorkerSnapshot[int]]) -> None:
        counts[slack_case(fleet)[1]] += 1

    draw()
    total = counts.total()
    print({case: f"{n / total:.1%}" for case, n in counts.items()})  # shown with -s
    assert counts[SLACK] >= total / 10 and counts[NO_SLACK] >= total / 10, counts


@st.composite
def tied_fleets(draw: st.DrawFn) -> tuple[list[WorkerSnapshot[int]], list[int]]:
    """A fleet in which two or more workers hold the most of a request alike, idle or
    serving one (within any cap), among others that hold less, are busier for as much, or
    hold more but are out of service; and the tied workers' handles."""
    held, load = draw(st.integers(1, 9)), draw(st.integers(0, 1))
    tied = draw(st.integers(2, 4))
    fleet = [WorkerSnapshot("", 0, True, load, held) for _ in range(tied)]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["less", "busier", "out", "none"]))
        if kind == "less":
            fleet.append(WorkerSnapshot("", 0, True, 0, draw(st.integers(0, held - 1))))
        elif kind == "busier":
            fleet.append(WorkerSnapshot("", 0, True, load + draw(st.integers(1, 3)), held))
        elif kind == "out":
            fleet.append(WorkerSnapshot("", 0, False, 0, held + 1))
        else:
            fleet.append(WorkerSnapshot("", 0, True, draw(st.integers(0, 3))))
    order = draw(st.permutations(range(len(fleet))))
    placed = [attrs.evolve(fleet[j], name=f"w{i}", handle=i) for i, j in enumerate(order)]
    return placed, [i for i, j in enumerate(order) if j < tied]


@given(tied_fleets(), st.integers(0, 1000), st.sampled_from(list(Balance)))
def test_equal_holders_take_requests_in_turn(
    drawn: tuple[list[WorkerSnapshot[int]], list[int]], start: int, balance: Balance
) -> None:
    fleet, tied = drawn
    event(f"{len(tied)} tied")
    event("beside others" if len(fleet) > len(tied) else "tied alone")
    turns = range(start, start + 2 * len(tied))
    chosen = [choose(fleet, role="prefill", balance=balance, turn=t).handle for t in turns]
    # Any run of as many turns as there are tied holders takes each of them once.
    for at in range(len(tied) + 1):
        assert sorted(chosen[at : at + len(tied)]) == tied

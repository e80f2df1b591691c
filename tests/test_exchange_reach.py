"""The exchange's table is whole and exact, and the random walks reach what the properties
are about.

- Every phase is reachable, and every edge of ``TRANSITIONS`` is taken, found by an
  exhaustive search over the exchange's states with a finite alphabet of events (so the
  generated state diagram shows nothing the exchange cannot do, and omits nothing).
- In every state reached, every event the state does not take raises ``ExchangeError``
  and leaves the exchange as it was.
- The walks of ``exchange_walks`` reach each case the properties are about in a measured
  share of examples.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Final

from hypothesis import HealthCheck, Phase, given, settings

from exchange_walks import COMPLETE, Step, fleet, walks
from pd_policy import (
    DecodeForm,
    KvConnectorMode,
    MalformedRequest,
    MediaUnreachable,
    MissingKvTransferParams,
    WorkerFailedToStart,
)
from pd_policy.exchange import Exchange
from pd_policy.exchange.events import (
    Begin,
    ClientLeft,
    DeadlinePassed,
    Event,
    FirstByte,
    HandoffCheck,
    KvFacts,
    Leg,
    LegAnswered,
    LegFailed,
    Plan,
    PlanFailed,
    Planned,
)
from pd_policy.exchange.states import TRANSITIONS, ExchangeError
from pd_policy.exchange.states import Phase as ExchangePhase
from pd_policy.kv_lease import KvLeaseExpired

_STRIPPED: Final = HandoffCheck(DecodeForm.TEXT_PLUS_HASHES, True, KvConnectorMode.TRANSFER)
_FULL: Final = HandoffCheck(DecodeForm.FULL, True, KvConnectorMode.TRANSFER)
_GOOD: Final = KvFacts(dict(COMPLETE[KvConnectorMode.TRANSFER]))
#: A prefill with a lease on its KV, and its answer past it.
_LEASED: Final = HandoffCheck(DecodeForm.FULL, True, KvConnectorMode.NIXL, lease=10.0)
_LATE: Final = KvFacts(dict(COMPLETE[KvConnectorMode.NIXL]), age=30.0)


def _alphabet() -> list[Event]:
    events: list[Event] = [Begin(), FirstByte(), ClientLeft(), DeadlinePassed()]
    plans = (
        (),
        (Leg.PREFILL,),
        (Leg.RENDER, Leg.PREFILL),
        (Leg.ENCODE, Leg.PREFILL),
        (Leg.RENDER, Leg.ENCODE, Leg.PREFILL),
        (Leg.ENCODE,),  # invalid: no prefill after it
        (Leg.RENDER,),  # invalid too
        (Leg.DECODE,),  # invalid: the decode is never planned
    )
    for legs in plans:
        for check in (_STRIPPED, _FULL):
            events.append(Planned(frozenset(legs), check))
    events.append(Planned(frozenset({Leg.PREFILL}), _LEASED))
    events += [PlanFailed(MediaUnreachable()), PlanFailed(MalformedRequest("no"))]
    for leg in Leg:
        for status in (503, 400):
            events.append(LegFailed(leg, WorkerFailedToStart(_name(leg), http_status=status)))
        events.append(LegAnswered(leg))
    events.append(LegAnswered(Leg.PREFILL, _GOOD))
    events.append(LegAnswered(Leg.PREFILL, _LATE))  # past the lease, when there is one
    events.append(LegAnswered(Leg.ENCODE, _GOOD))  # KV from a leg that is not the prefill
    return events


def _name(leg: Leg) -> str:
    return "prefill" if leg is Leg.RENDER else leg.value


def _key(exchange: Exchange[Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in vars(exchange).items() if k != "_place"))


Edges = set[tuple[ExchangePhase, type, ExchangePhase]]


def _search() -> tuple[set[ExchangePhase], Edges, int]:
    """Every state reached with the alphabet by an exchange with a budget of two, over a
    fleet of two of each role and over one with no decode; the phases, the edges taken,
    and how many invalid events were tried (each checked to raise and change nothing)."""
    phases: set[ExchangePhase] = set()
    edges: Edges = set()
    refused = 0
    for sizes in ((2, 2, 2), (1, 0, 0)):
        found = _search_fleet(*sizes)
        phases |= found[0]
        edges |= found[1]
        refused += found[2]
    return phases, edges, refused


def _search_fleet(
    prefills: int, decodes: int, encoders: int
) -> tuple[set[ExchangePhase], Edges, int]:
    def replayed(events: tuple[Event, ...]) -> Exchange[str]:
        exchange = Exchange(fleet(prefills, decodes, encoders).place, attempts=2)
        for event in events:
            exchange.handle(event)
        return exchange

    start = replayed(())
    seen = {_key(start)}
    queue: list[tuple[Event, ...]] = [()]
    phases: set[ExchangePhase] = {start.phase}
    edges: Edges = set()
    refused = 0
    while queue:
        path = queue.pop()
        for event in _alphabet():
            trial = replayed(path)
            before, key = trial.phase, _key(trial)
            try:
                trial.handle(event)
            except ExchangeError:
                assert _key(trial) == key, f"{event} changed a {before.value} exchange"
                refused += 1
                continue
            assert type(event) in TRANSITIONS[before]
            phases.add(trial.phase)
            edges.add((before, type(event), trial.phase))
            if _key(trial) not in seen:
                seen.add(_key(trial))
                queue.append((*path, event))
    return phases, edges, refused


def test_every_phase_and_every_edge_of_the_table_is_reached_and_nothing_else() -> None:
    phases, edges, refused = _search()
    assert phases == set(ExchangePhase)
    table = {
        (p, kind, q) for p, events in TRANSITIONS.items() for kind, qs in events.items() for q in qs
    }
    assert edges == table
    assert refused > 100  # invalid events were tried in every phase


def test_an_event_a_phase_does_not_take_is_refused_in_every_phase() -> None:
    phases, edges, _ = _search()
    every_kind = {type(e) for e in _alphabet()}
    taken = {(p, kind) for p, kind, _ in edges}
    for phase in phases:
        for kind in every_kind - set(TRANSITIONS[phase]):
            assert (phase, kind) not in taken


def _cases(steps: list[Step], exchange: Exchange[str]) -> set[str]:
    finish = exchange.finish
    assert finish is not None
    actions = [a for s in steps for a in s.actions]
    plans = [a for a in actions if isinstance(a, Plan)]
    found = {finish.outcome if finish.outcome in ("ok", "client_left") else "failed"}
    if len(plans) > 1:
        found.add("retried")
    if finish.late:
        found.add("late failure")
    if isinstance(finish.error, MissingKvTransferParams):
        found.add("handoff refused")
    if any(isinstance(p.after, KvLeaseExpired) for p in plans) or isinstance(
        finish.error, KvLeaseExpired
    ):
        found.add("lease ran out")
    if any(isinstance(s.event, Planned) and Leg.ENCODE in s.event.legs for s in steps):
        found.add("E/P/D")
    if finish.outcome == "pd_request_timeout":
        found.add("deadline")
    if exchange.attempt > len(plans):  # a retry found no member left: the last failure
        assert finish.error is not None and finish.error.retryable
        found.add("no worker left to retry on")
    return found


@settings(
    max_examples=400,
    derandomize=True,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(walks())
def test_the_walks_reach_every_case_the_properties_are_about(walk: Any) -> None:
    exchange, _, steps = walk
    _COUNTS.update(_cases(steps, exchange))
    _COUNTS["walks"] += 1


_COUNTS: Counter[str] = Counter()


def test_each_case_is_reached_in_a_fair_share_of_the_walks() -> None:
    _COUNTS.clear()
    test_the_walks_reach_every_case_the_properties_are_about()
    total = _COUNTS.pop("walks")
    shares = {case: count / total for case, count in _COUNTS.items()}
    cases = (
        "ok",
        "failed",
        "client_left",
        "retried",
        "late failure",
        "handoff refused",
        "lease ran out",
        "E/P/D",
        "deadline",
        "no worker left to retry on",
    )
    low = {case: round(shares.get(case, 0.0), 3) for case in cases if shares.get(case, 0) < 0.03}
    assert not low, f"cases the walks rarely reach: {low} (of {total})"

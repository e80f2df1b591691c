"""The exchange, by example: a request's life as a router drives it, over a real roster and the
core's placement. The rules in general are properties (``test_exchange_properties.py``)."""

from __future__ import annotations

import pytest

from exchange_walks import COMPLETE
from pd_policy import (
    DecodeForm,
    Health,
    HealthPolicy,
    InvalidConfiguration,
    KvConnectorMode,
    MalformedRequest,
    MediaUnreachable,
    MissingKvTransferParams,
    Placement,
    RequestTimedOut,
    Roster,
    Support,
    WorkerCapability,
    WorkerFailedToStart,
    place,
)
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy.exchange import Exchange, fixed, settle
from pd_policy.exchange.events import (
    Begin,
    ClientLeft,
    DeadlinePassed,
    Finish,
    FirstByte,
    HandoffCheck,
    KvFacts,
    Leg,
    LegAnswered,
    LegFailed,
    Plan,
    PlanFailed,
    Planned,
    Relay,
    Send,
)
from pd_policy.exchange.states import ExchangeError, Phase
from pd_policy.kv_lease import KvLeaseExpired
from pd_policy.tools.scenarios import image_request

VISION = WorkerCapability(Support.TRUE)
LM_ONLY = WorkerCapability(Support.FALSE)
STRIPPED = HandoffCheck(DecodeForm.TEXT_PLUS_HASHES, True, KvConnectorMode.TRANSFER)
HANDED = KvFacts(COMPLETE[KvConnectorMode.TRANSFER])


def roster(prefills: int = 2, decodes: int = 2) -> Roster[WorkerCapability]:
    fleet: Roster[WorkerCapability] = Roster(clock=lambda: 0.0, policy=HealthPolicy(failures=1))
    for i in range(prefills):
        fleet.add_member("prefill", f"p{i}", VISION)
    for i in range(decodes):
        fleet.add_member("decode", f"d{i}", LM_ONLY)
    return fleet


def exchange(fleet: Roster[WorkerCapability], attempts: int = 2) -> Exchange[WorkerCapability]:
    request = image_request()

    def placer(excluded: tuple[str, ...]) -> Placement[WorkerCapability]:
        return place(fleet, request, capability=lambda m: m.worker, exclude=excluded)

    return Exchange(placer, attempts=attempts)


def test_a_pd_request_plans_prefills_checks_the_handoff_relays_and_credits() -> None:
    fleet = roster()
    ex = exchange(fleet)
    plan = settle(fleet, ex.handle(Begin()))
    assert isinstance(plan, Plan) and plan.attempt == 1 and plan.after is None
    held = {m.name for m in fleet if m.outstanding == 1}
    assert held == {plan.placement.prefill.name, plan.placement.decode.name}  # held, once
    send = settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), STRIPPED)))
    assert send == Send(Leg.PREFILL, plan.placement.prefill)
    relay = settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, HANDED)))
    assert relay == Relay(plan.placement.decode) and ex.phase is Phase.DECODING
    assert ex.handle(FirstByte()) == ()  # a first byte asks nothing of the router
    done = settle(fleet, ex.handle(LegAnswered(Leg.DECODE)))
    assert done == Finish(200) and ex.finish == done
    assert [m.outstanding for m in fleet] == [0, 0, 0, 0]


def test_a_stripped_leg_whose_prefill_handed_nothing_over_is_the_502_and_no_decode() -> None:
    fleet = roster()
    ex = exchange(fleet)
    settle(fleet, ex.handle(Begin()))
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), STRIPPED)))
    end = settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, KvFacts({}))))
    assert isinstance(end, Finish) and isinstance(end.error, MissingKvTransferParams)
    assert end.status == 502 and not end.late
    assert all(m.health.health is Health.HEALTHY for m in fleet)  # nobody is blamed


def test_a_decode_that_fails_before_any_byte_is_retried_without_it_and_ejected() -> None:
    fleet = roster()
    ex = exchange(fleet)
    first = settle(fleet, ex.handle(Begin()))
    assert isinstance(first, Plan)
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), STRIPPED)))
    settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, HANDED)))
    failed = WorkerFailedToStart("decode", http_status=503)
    again = settle(fleet, ex.handle(LegFailed(Leg.DECODE, failed)))
    assert isinstance(again, Plan) and again.attempt == 2 and again.after is failed
    assert again.leg is Leg.DECODE and again.placement.decode is not first.placement.decode
    assert first.placement.decode.health.health is Health.EJECTED  # one failure, policy of 1
    assert ex.excluded == (first.placement.decode.name,)


def test_after_the_first_byte_a_failure_ends_the_stream_and_is_never_retried() -> None:
    fleet = roster()
    ex = exchange(fleet)
    settle(fleet, ex.handle(Begin()))
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), STRIPPED)))
    settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, HANDED)))
    ex.handle(FirstByte())
    cut = WorkerFailedToStart("decode", http_status=503)
    end = settle(fleet, ex.handle(LegFailed(Leg.DECODE, cut)))
    assert end == Finish(200, cut, late=True, outcome=cut.code)


def test_with_no_member_left_the_client_gets_the_failure_that_made_it_try() -> None:
    fleet = roster(prefills=1, decodes=1)
    ex = exchange(fleet, attempts=3)
    settle(fleet, ex.handle(Begin()))
    refused = WorkerFailedToStart("prefill", http_status=502)
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), STRIPPED)))
    end = settle(fleet, ex.handle(LegFailed(Leg.PREFILL, refused)))
    assert isinstance(end, Finish) and end.error is refused and end.status == 502


def test_a_retry_that_finds_only_a_decode_blind_to_media_gives_the_failure_that_made_it_try() -> (
    None
):
    # A transfer failed on the one decode that loads the prefill's KV; the other recomputes
    # a failed load, so the policy will not give it the image: the client is told of the
    # failure, not that its request needs another kind of decode (a 400 of its own). The
    # placement finds the failed decode the only compatible one, and it is left out.
    fleet: Roster[WorkerCapability] = Roster(clock=lambda: 0.0, policy=HealthPolicy(failures=1))
    fleet.add_member("prefill", "p0", VISION)
    fleet.add_member("decode", "d-fail", LM_ONLY)
    blind = DecodeKv(KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE)
    fleet.add_member("decode", "d-recompute", WorkerCapability(Support.FALSE, decode_kv=blind))
    ex = exchange(fleet)
    first = settle(fleet, ex.handle(Begin()))
    assert isinstance(first, Plan) and first.placement.decode.name == "d-fail"
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), STRIPPED)))
    settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, HANDED)))
    failed = WorkerFailedToStart("decode", detail="Internal server error", http_status=500)
    end = settle(fleet, ex.handle(LegFailed(Leg.DECODE, failed)))
    assert isinstance(end, Finish) and end.error is failed and end.status == 500


LEASED = HandoffCheck(DecodeForm.TEXT_PLUS_HASHES, True, KvConnectorMode.NIXL, lease=30.0)
NIXL_HANDED = COMPLETE[KvConnectorMode.NIXL]


def test_a_prefill_answer_past_its_lease_is_its_failure_tried_on_another_prefill() -> None:
    fleet = roster()
    ex = exchange(fleet)
    first = settle(fleet, ex.handle(Begin()))
    assert isinstance(first, Plan)
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), LEASED)))
    again = settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, KvFacts(NIXL_HANDED, age=25.0))))
    assert isinstance(again, Plan) and isinstance(again.after, KvLeaseExpired)
    assert again.leg is Leg.PREFILL and ex.excluded == (first.placement.prefill.name,)
    assert again.placement.prefill is not first.placement.prefill
    assert all(m.health.health is not Health.EJECTED for m in fleet)  # not the worker's fault
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), LEASED)))
    relay = settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, KvFacts(NIXL_HANDED, age=24.9))))
    assert relay == Relay(again.placement.decode)


def test_with_one_prefill_an_answer_past_its_lease_is_the_502() -> None:
    fleet = roster(prefills=1, decodes=1)
    ex = exchange(fleet)
    settle(fleet, ex.handle(Begin()))
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), LEASED)))
    end = settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, KvFacts(NIXL_HANDED, age=40.0))))
    assert isinstance(end, Finish) and isinstance(end.error, KvLeaseExpired)
    assert end.status == 502 and end.outcome == "pd_kv_lease_expired"


def test_a_lease_binds_only_a_handoff_a_prefill_answered() -> None:
    # Planned up front (no prefill ran, or it returned nothing): no lease runs on it.
    fleet = roster()
    ex = exchange(fleet)
    first = settle(fleet, ex.handle(Begin()))
    assert isinstance(first, Plan)
    relay = settle(fleet, ex.handle(Planned(frozenset(), LEASED, KvFacts(NIXL_HANDED, age=99.0))))
    assert relay == Relay(first.placement.decode)
    text = HandoffCheck(DecodeForm.FULL, False, KvConnectorMode.NIXL, lease=30.0)
    ex = exchange(fleet)
    plan = settle(fleet, ex.handle(Begin()))
    assert isinstance(plan, Plan)
    settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), text)))
    relay = settle(fleet, ex.handle(LegAnswered(Leg.PREFILL, KvFacts(None, age=99.0))))
    assert relay == Relay(plan.placement.decode)


def test_a_client_that_leaves_or_a_deadline_that_passes_blames_nobody() -> None:
    ends = ((ClientLeft(), 499, "client_left"), (DeadlinePassed(), 504, RequestTimedOut.code))
    for event, status, outcome in ends:
        fleet = roster()
        ex = exchange(fleet)
        settle(fleet, ex.handle(Begin()))
        settle(fleet, ex.handle(Planned(frozenset({Leg.PREFILL}), STRIPPED)))
        end = settle(fleet, ex.handle(event))
        assert isinstance(end, Finish) and (end.status, end.outcome) == (status, outcome)
        assert all(m.outstanding == 0 and m.health.health is Health.HEALTHY for m in fleet)


def test_a_refusal_while_planning_is_not_retried_and_a_fetch_failure_is() -> None:
    fleet = roster()
    ex = exchange(fleet)
    settle(fleet, ex.handle(Begin()))
    assert isinstance(settle(fleet, ex.handle(PlanFailed(MediaUnreachable()))), Plan)
    end = settle(fleet, ex.handle(PlanFailed(MalformedRequest("no", param="body"))))
    assert isinstance(end, Finish) and end.status == 400


def test_events_out_of_turn_are_typed_errors_that_change_nothing() -> None:
    fleet = roster()
    ex = exchange(fleet)
    with pytest.raises(ExchangeError):
        ex.handle(FirstByte())
    settle(fleet, ex.handle(Begin()))
    with pytest.raises(ExchangeError):
        ex.handle(LegAnswered(Leg.PREFILL))  # nothing was sent yet
    with pytest.raises(ExchangeError):
        ex.handle(Planned(frozenset({Leg.ENCODE, Leg.PREFILL}), STRIPPED))  # no encoder
    assert ex.phase is Phase.PLANNING and ex.attempt == 1
    assert ExchangeError.error_status_hint == 500


def test_a_budget_must_be_a_positive_integer() -> None:
    placement = place(roster(), image_request(), capability=lambda m: m.worker)
    with pytest.raises(InvalidConfiguration):
        Exchange(fixed(placement), attempts=0)

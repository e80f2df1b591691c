"""The exchange's rules, as properties over random walks of events (``exchange_walks``).

Each property reads the trace of a walk: what the exchange was told, and what it asked
for. ``test_exchange_reach.py`` shows the walks reach the cases these are about, and
that every phase and every edge of the table is reached.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given

from exchange_walks import Fleet, Member, Step, walks
from pd_policy import DecodeForm, MissingKvTransferParams, WorkerFailedToStart, missing_kv_fields
from pd_policy.exchange import Exchange
from pd_policy.exchange.events import (
    BEFORE_DECODE,
    Credit,
    Finish,
    FirstByte,
    HandoffCheck,
    Hold,
    KvFacts,
    Leg,
    LegAnswered,
    LegFailed,
    Penalize,
    Plan,
    PlanFailed,
    Planned,
    Relay,
    Release,
    Send,
)
from pd_policy.exchange.states import Phase
from pd_policy.kv_lease import KvLeaseExpired

Walk = tuple[Exchange[str], Fleet, list[Step]]


def _actions(steps: list[Step]) -> list[object]:
    return [action for step in steps for action in step.actions]


@given(walks())
def test_every_exchange_ends_within_a_bound_of_its_budget(walk: Walk) -> None:
    exchange, fleet, steps = walk
    # Per attempt: a plan, three legs, the first byte and the decode's end; and the begin.
    assert len(steps) <= 6 * exchange.attempts + 1
    assert steps[-1].after in (Phase.DONE, Phase.FAILED)
    assert isinstance(steps[-1].actions[-1], Finish) and exchange.finish is not None
    assert all(not isinstance(a, Finish) for step in steps[:-1] for a in step.actions)
    assert fleet.calls <= exchange.attempts  # one choice per attempt


@given(walks())
def test_nothing_is_retried_once_the_client_has_seen_a_byte(walk: Walk) -> None:
    exchange, _, steps = walk
    seen = False
    for step in steps:
        if seen:
            assert not any(isinstance(a, Plan | Send | Relay) for a in step.actions)
        seen = seen or isinstance(step.event, FirstByte)
    finish = exchange.finish
    assert finish is not None
    if seen and finish.error is not None:  # the stream's last event, after a 200
        assert finish.late and finish.status == 200
    if not seen:
        assert not finish.late


def _stripped(check: HandoffCheck) -> bool:
    text_plus_hashes = check.form is DecodeForm.TEXT_PLUS_HASHES and check.multimodal
    return text_plus_hashes or check.form is DecodeForm.MROPE_METADATA


def _expired(check: HandoffCheck, kv: KvFacts | None) -> bool:
    """Whether a prefill answered with a handoff that leaves 5 s (or half the lease) or less
    of its lease: the rule, as written."""
    if check.lease is None or kv is None or kv.params is None:
        return False
    return kv.age >= check.lease - min(5.0, check.lease / 2)


def _handoffs(steps: list[Step]) -> list[tuple[Step, HandoffCheck, KvFacts | None]]:
    """Each step whose event is the prefill's answer, with the check and the handoff it
    answered with (``None``: none, the planned one stays)."""
    found = []
    check: HandoffCheck | None = None
    for step in steps:
        event = step.event
        if isinstance(event, Planned):
            check = event.check
        if isinstance(event, LegAnswered) and event.leg is Leg.PREFILL:
            assert check is not None
            found.append((step, check, event.kv))
    return found


@given(walks())
def test_never_a_decode_leg_before_a_complete_handoff_on_a_stripped_leg(walk: Walk) -> None:
    _, _, steps = walk
    check: HandoffCheck | None = None
    kv = KvFacts()
    for step in steps:
        event = step.event
        if isinstance(event, Planned):
            check, kv = event.check, event.kv
        if isinstance(event, LegAnswered) and event.kv is not None:
            kv = event.kv
        missing = None if check is None else missing_kv_fields(check.mode, kv.params, kv.legacy)
        if any(isinstance(a, Relay) for a in step.actions):
            assert check is not None
            assert not _stripped(check) or missing == ()
        finish = step.actions[-1] if step.actions else None
        if isinstance(finish, Finish) and isinstance(finish.error, MissingKvTransferParams):
            assert check is not None and _stripped(check) and missing != ()
            assert finish.status == 502


@given(walks())
def test_a_handoff_is_relayed_only_within_its_prefills_lease(walk: Walk) -> None:
    _, _, steps = walk
    for step, check, kv in _handoffs(steps):
        relayed = any(isinstance(a, Relay) for a in step.actions)
        if _expired(check, kv):
            assert not relayed
            nothing = [a for a in step.actions if isinstance(a, Plan | Finish)]
            assert len(nothing) == 1
            error = nothing[0].after if isinstance(nothing[0], Plan) else nothing[0].error
            assert isinstance(error, KvLeaseExpired) and error.status == 502
            assert not any(isinstance(a, Penalize) for a in step.actions)  # not the worker's
        elif relayed and check.lease is not None and kv is not None and kv.params is not None:
            assert kv.age < check.lease - 1


@given(walks())
def test_blame_falls_on_the_member_the_failed_leg_went_to_and_on_no_other(walk: Walk) -> None:
    exchange, _, steps = walk
    late = [step for step, check, kv in _handoffs(steps) if _expired(check, kv)]
    sent: dict[Leg, Member] = {}
    excluded: list[str] = []
    attempt, seen = 1, False
    for step in steps:
        seen = seen or isinstance(step.event, FirstByte)
        penalized = [a.member for a in step.actions if isinstance(a, Penalize)]
        expected: list[Member] = []
        event = step.event
        if isinstance(event, LegFailed):
            blamed = sent[event.leg]
            error = event.error
            if isinstance(error, WorkerFailedToStart) and error.status >= 500:
                expected = [blamed]
            if error.retryable and not seen and attempt < exchange.attempts:
                excluded.append(blamed.name)  # tried again: left out, whether or not found
                attempt += 1
        elif isinstance(event, PlanFailed) and event.error.retryable:
            attempt += attempt < exchange.attempts
        elif step in late and attempt < exchange.attempts:
            # The prefill's answer came past its lease: its leg failed, it is left out.
            excluded.append(sent[Leg.PREFILL].name)
            attempt += 1
        assert penalized == expected
        for action in step.actions:
            if isinstance(action, Plan):
                sent = {}
                names = {m.name for m in action.placement.members}
                assert not names & set(excluded)  # left out of the next choice
            elif isinstance(action, Send):
                sent[action.leg] = action.member
            elif isinstance(action, Relay):
                sent[Leg.DECODE] = action.member
    assert list(exchange.excluded) == excluded


@given(walks())
def test_retries_stay_within_the_budget_and_only_for_what_may_be_retried(walk: Walk) -> None:
    exchange, _, steps = walk
    plans = [a for a in _actions(steps) if isinstance(a, Plan)]
    assert len(plans) <= exchange.attempts
    assert [p.attempt for p in plans] == list(range(1, len(plans) + 1))
    assert plans[0].after is None if plans else True
    for plan in plans[1:]:
        assert plan.after is not None and plan.after.retryable
    if exchange.attempt > len(plans):
        # A retry found no member left: the client gets the failure that made it try,
        # never a 503 for a fleet it did not ask about.
        last = steps[-1].event
        assert exchange.finish is not None
        if isinstance(last, LegAnswered):  # a prefill's answer past its lease: its failure
            assert last.leg is Leg.PREFILL and isinstance(exchange.finish.error, KvLeaseExpired)
        else:
            assert isinstance(last, LegFailed | PlanFailed)
            assert exchange.finish.error is last.error


@given(walks())
def test_every_load_held_is_released_and_only_a_success_credits(walk: Walk) -> None:
    exchange, _, steps = walk
    load: Counter[str] = Counter()
    placements = []
    for action in _actions(steps):
        if isinstance(action, Hold | Release):
            for member in action.members:
                load[member.name] += 1 if isinstance(action, Hold) else -1
                assert load[member.name] in (0, 1)
        if isinstance(action, Plan):
            placements.append(action.placement)
    assert not +load  # everything held was released
    credits = [a for a in _actions(steps) if isinstance(a, Credit)]
    if exchange.phase is Phase.DONE:
        assert [c.members for c in credits] == [placements[-1].members]
        assert exchange.finish == Finish(200)
    else:
        assert not credits


@given(walks())
def test_an_attempt_runs_its_legs_in_order_and_renders_on_the_encoder_in_epd(walk: Walk) -> None:
    _, _, steps = walk
    legs: list[Leg] = []
    planned: frozenset[Leg] = frozenset()
    placement = None
    for step in steps:
        if isinstance(step.event, Planned):
            planned = step.event.legs
        for action in step.actions:
            if isinstance(action, Plan):
                legs, placement = [], action.placement
            elif isinstance(action, Send):
                assert placement is not None
                legs.append(action.leg)
                encoder = Leg.ENCODE in planned
                owner = {
                    Leg.RENDER: placement.encoder if encoder else placement.prefill,
                    Leg.ENCODE: placement.encoder,
                    Leg.PREFILL: placement.prefill,
                }[action.leg]
                assert action.member is owner
            elif isinstance(action, Relay):
                assert placement is not None and action.member is placement.decode
                # Every planned leg ran, in order, each once, before the decode.
                assert legs == [leg for leg in BEFORE_DECODE if leg in planned]
        assert legs == sorted(legs, key=BEFORE_DECODE.index)
        assert len(legs) == len(set(legs))

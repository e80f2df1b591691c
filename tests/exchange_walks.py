"""Random walks through an [`Exchange`][pd_policy.exchange.machine.Exchange]: a fleet to place
on, the events a router could report in each phase, and the trace of what the exchange answered.

A walk draws, at each step, one of the events the exchange's phase takes (by the table
it is checked against, so every kind is drawn where it may come), with the parameters a
real router could give it: the legs a plan needs, a handoff complete or not for its
contract, a worker's failure of any status or a refusal, the first byte, the client
leaving, the deadline. The properties read the trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import attrs
from hypothesis import strategies as st

from pd_policy import (
    DecodeForm,
    KvConnectorMode,
    MalformedRequest,
    MediaUnreachable,
    MissingEncoderOutput,
    NoWorkerAvailable,
    Placement,
    PolicyError,
    RosterMember,
    WorkerFailedToStart,
    WorkerStreamError,
)
from pd_policy.exchange import Exchange
from pd_policy.exchange.events import (
    Action,
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
    PlanFailed,
    Planned,
)
from pd_policy.exchange.states import LEG_OF, TRANSITIONS, Phase

Member = RosterMember[str]

#: A handoff that names its transfer, by contract.
COMPLETE: Final[dict[KvConnectorMode, dict[str, Any]]] = {
    KvConnectorMode.NIXL: {
        "do_remote_prefill": True,
        "remote_engine_id": "e",
        "remote_block_ids": [1],
        "remote_host": "h",
        "remote_port": 9,
    },
    KvConnectorMode.TRANSFER: {"do_remote_prefill": True, "transfer_id": "t"},
    KvConnectorMode.NIXL_PUSH: {
        "do_remote_prefill": True,
        "remote_engine_id": "e",
        "remote_block_ids": [[1]],
        "remote_host": "h",
        "remote_port": 9,
    },
    KvConnectorMode.MOONCAKE: {
        "do_remote_prefill": True,
        "transfer_id": "t",
        "remote_engine_id": "e",
        "remote_bootstrap_addr": "h:1",
    },
    KvConnectorMode.PASSTHROUGH: {"anything": 1},
}
#: The legs a plan may need before the decode: E/P/D's only with an encoder listed.
PLANS: Final = ((), (Leg.PREFILL,), (Leg.RENDER, Leg.PREFILL))
EPD_PLANS: Final = ((Leg.ENCODE, Leg.PREFILL), (Leg.RENDER, Leg.ENCODE, Leg.PREFILL))


@attrs.define
class Fleet:
    """Members by role, placed in order, leaving out those named: the simplest placement
    (the real one is the core's ``place``, tested on its own)."""

    prefills: list[Member]
    decodes: list[Member]
    encoders: list[Member]
    calls: int = 0

    def place(self, excluded: tuple[str, ...]) -> Placement[str]:
        self.calls += 1

        def first(role: str, members: Sequence[Member]) -> Member:
            for member in members:
                if member.name not in excluded:
                    return member
            raise NoWorkerAvailable(role)

        encoder = first("encode", self.encoders) if self.encoders else None
        return Placement(first("prefill", self.prefills), first("decode", self.decodes), encoder)


def fleet(prefills: int, decodes: int, encoders: int) -> Fleet:
    def members(role: str, count: int) -> list[Member]:
        return [Member(role, f"{role}-{i}", f"{role}-{i}") for i in range(count)]

    return Fleet(
        members("prefill", prefills), members("decode", decodes), members("encode", encoders)
    )


@attrs.frozen
class Step:
    """One step of a walk: the phase before, the event, the actions, the phase after."""

    before: Phase
    event: Event
    actions: tuple[Action, ...]
    after: Phase


#: A prefill's lease on its KV in the walks (``None``: none), and the ages of a handoff: in
#: time, too close to the end of that lease, past it.
LEASES: Final = (None, 10.0, 10.0)
AGES: Final = (0.5, 6.0, 30.0)


def _kv(draw: st.DrawFn, mode: KvConnectorMode, *, answered: bool = True) -> KvFacts:
    # A handoff has an age once a prefill answered it; one planned up front has none.
    kind = draw(st.sampled_from(("complete", "complete", "none", "empty", "partial", "legacy")))
    if kind == "complete":
        age = draw(st.sampled_from(AGES)) if answered else 0.0
        return KvFacts(dict(COMPLETE[mode]), age=age)
    if kind == "empty":
        return KvFacts({})
    if kind == "partial":
        return KvFacts({"do_remote_prefill": True})
    if kind == "legacy":
        return KvFacts(None, ("h", 9))
    return KvFacts()


def _error(draw: st.DrawFn, leg: Leg | None) -> PolicyError:
    name = "decode" if leg is None or leg is Leg.DECODE else leg.value
    name = "prefill" if name == "render" else name
    kind = draw(st.sampled_from(("5xx", "5xx", "stream", "4xx", "429", "refusal", "encoder")))
    if kind == "5xx":
        return WorkerFailedToStart(name, http_status=draw(st.sampled_from((500, 502, 503, 504))))
    if kind == "stream":
        return WorkerStreamError(name, http_status=502)
    if kind == "4xx":
        return WorkerFailedToStart(name, http_status=400)
    if kind == "429":
        return WorkerFailedToStart(name, http_status=429)
    if kind == "encoder":
        return MissingEncoderOutput()
    return MalformedRequest("refused", param="body")


def _planned(draw: st.DrawFn, exchange: Exchange[str]) -> Planned:
    placement = exchange.placement
    assert placement is not None
    plans = PLANS + (EPD_PLANS if placement.encoder is not None else ())
    legs = frozenset(draw(st.sampled_from(plans)))
    mode = draw(st.sampled_from(list(KvConnectorMode)))
    form = draw(st.sampled_from(list(DecodeForm)))
    check = HandoffCheck(form, draw(st.booleans()), mode, draw(st.sampled_from(LEASES)))
    kv = _kv(draw, mode, answered=False) if draw(st.booleans()) else KvFacts()
    return Planned(legs, check, kv)


#: Each kind of event, weighted so that a walk mostly goes on: the client leaving and the
#: deadline end it wherever they are drawn.
_WEIGHTS: Final[dict[type[Any], int]] = {
    Begin: 1,
    Planned: 40,
    PlanFailed: 5,
    LegAnswered: 30,
    LegFailed: 15,
    FirstByte: 30,
    ClientLeft: 1,
    DeadlinePassed: 1,
}
#: Once the client has seen output, a failure is as likely as the end: the late case.
_RESPONDING: Final[dict[type[Any], int]] = {**_WEIGHTS, LegFailed: 30, DeadlinePassed: 6}


def draw_event(draw: st.DrawFn, exchange: Exchange[str], mode: KvConnectorMode) -> Event:
    """One event the exchange's phase takes, with drawn parameters."""
    kinds = sorted(TRANSITIONS[exchange.phase], key=lambda k: k.__name__)
    weights = _RESPONDING if exchange.phase is Phase.RESPONDING else _WEIGHTS
    kind = draw(st.sampled_from([k for k in kinds for _ in range(weights[k])]))
    if kind is Planned:
        return _planned(draw, exchange)
    if kind is PlanFailed:
        return PlanFailed(draw(st.sampled_from((MediaUnreachable(), MalformedRequest("x")))))
    leg = LEG_OF.get(exchange.phase)
    if kind is LegAnswered:
        assert leg is not None
        handed = draw(st.sampled_from((True, True, True, False)))
        kv = _kv(draw, mode) if leg is Leg.PREFILL and handed else None
        return LegAnswered(leg, kv)
    if kind is LegFailed:
        assert leg is not None
        return LegFailed(leg, _error(draw, leg))
    event: Event = kind()
    return event


@st.composite
def walks(draw: st.DrawFn) -> tuple[Exchange[str], Fleet, list[Step]]:
    """A fleet, an exchange on it, and a walk that runs until the exchange ends."""
    placed = fleet(draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(0, 1)))
    exchange = Exchange(placed.place, attempts=draw(st.integers(1, 3)))
    steps: list[Step] = []
    mode = KvConnectorMode.NIXL
    while exchange.finish is None:
        assert len(steps) <= 200, "the walk did not end"
        event = Begin() if exchange.phase is Phase.NEW else draw_event(draw, exchange, mode)
        if isinstance(event, Planned):  # the prefill's handoff is mostly for its contract
            mode = event.check.mode
        before = exchange.phase
        actions = exchange.handle(event)
        steps.append(Step(before, event, actions, exchange.phase))
    return exchange, placed, steps

"""The conformance operation of a request's life: an
[`Exchange`][pd_policy.exchange.machine.Exchange] fed a list of events, and the actions it
answered.

* ``exchange``: ``members`` names each role's members in order (``prefill``, ``decode``,
  ``encode``), placed as "the first of each role not left out"; ``attempts`` is the
  budget; ``events`` is the list fed in order. The outcome is every action, in order, as
  a list (``["hold", names]``, ``["release", names]``, ``["penalize", name]``,
  ``["credit", names]``, ``["plan", attempt, {"prefill", "decode", "encode"}, after]``,
  ``["send", leg, name]``, ``["relay", name]``, ``["finish", status, outcome, late]``),
  with the finish's status and error code at the top; an event out of turn ends it with
  ``exchange_error`` and the index of that event.

An event is an object with an ``event`` of ``begin``, ``planned`` (``legs``, ``form``,
``multimodal``, ``mode``, an optional ``kv``), ``plan_failed`` (``error``),
``leg_answered`` (``leg``, an optional ``kv``), ``leg_failed`` (``leg``, ``error``),
``first_byte``, ``client_left`` or ``deadline_passed``. A ``kv`` is ``{"params": ...,
"legacy": [host, port]}``; an ``error`` is ``{"worker": leg, "status": n}`` (a worker's
failure; ``"stream": true`` once it had started) or ``{"code": code}`` for an error of the
catalog that takes no argument.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from pd_policy.catalog import ERROR_CATALOG
from pd_policy.connectors import KvConnectorMode
from pd_policy.decision import DecodeForm
from pd_policy.errors import MalformedRequest, NoWorkerAvailable, PolicyError
from pd_policy.exchange import Exchange
from pd_policy.exchange.events import (
    Action,
    Begin,
    ClientLeft,
    Credit,
    DeadlinePassed,
    Event,
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
from pd_policy.exchange.states import ExchangeError
from pd_policy.fleet.placement import Placement
from pd_policy.fleet.roster import Member
from pd_policy.worker_errors import WorkerFailedToStart, WorkerStreamError

from .reading import field, opt_field

__all__ = ["EXCHANGE_OPERATIONS"]

_SIMPLE: Final[dict[str, Callable[[], Event]]] = {
    "begin": Begin,
    "first_byte": FirstByte,
    "client_left": ClientLeft,
    "deadline_passed": DeadlinePassed,
}


def _enum(kind: type[Any], value: object, param: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise MalformedRequest(f"an unknown {param}", param=param) from None


def _kv(event: Mapping[str, Any]) -> KvFacts | None:
    kv = event.get("kv")
    if kv is None:
        return None
    if not isinstance(kv, Mapping):
        raise MalformedRequest("must be an object", param="kv")
    legacy = kv.get("legacy")
    age = float(opt_field(kv, "age", int) or 0)  # seconds since the prefill leg went out
    if legacy is None:
        return KvFacts(kv.get("params"), age=age)
    if not (
        isinstance(legacy, list)
        and len(legacy) == 2
        and isinstance(legacy[0], str)
        and type(legacy[1]) is int
    ):
        raise MalformedRequest("must be [host, port]", param="kv.legacy")
    return KvFacts(kv.get("params"), (legacy[0], legacy[1]), age)


def _error(spec: object) -> PolicyError:
    if not isinstance(spec, Mapping):
        raise MalformedRequest("must be an object", param="error")
    try:
        if "worker" in spec:
            kind = WorkerStreamError if spec.get("stream") else WorkerFailedToStart
            return kind(field(spec, "worker", str), http_status=field(spec, "status", int))
        entry = ERROR_CATALOG.get(field(spec, "code", str))
        if entry is None:
            raise MalformedRequest("an unknown error code", param="error")
        return entry.error()
    except (ValueError, TypeError):  # a leg no worker has, a code that needs its leg
        raise MalformedRequest("an error this operation cannot make", param="error") from None


def _event(item: object) -> Event:
    if not isinstance(item, Mapping):
        raise MalformedRequest("an event must be an object", param="events")
    name = field(item, "event", str)
    if name in _SIMPLE:
        return _SIMPLE[name]()
    if name == "planned":
        legs = frozenset(_enum(Leg, leg, "leg") for leg in field(item, "legs", list))
        check = HandoffCheck(
            _enum(DecodeForm, field(item, "form", str), "form"),
            field(item, "multimodal", bool),
            _enum(KvConnectorMode, field(item, "mode", str), "mode"),
            opt_field(item, "lease", int),  # the prefill's lease on its KV, in seconds
        )
        return Planned(legs, check, _kv(item) or KvFacts())
    if name == "plan_failed":
        return PlanFailed(_error(item.get("error")))
    leg = _enum(Leg, field(item, "leg", str), "leg")
    if name == "leg_answered":
        return LegAnswered(leg, _kv(item))
    if name == "leg_failed":
        return LegFailed(leg, _error(item.get("error")))
    raise MalformedRequest("an unknown event", param="event")


def _names(members: tuple[Member[None], ...]) -> list[str]:
    return [m.name for m in members]


def _action(action: Action) -> list[Any]:
    if isinstance(action, Hold | Release | Credit):
        return [type(action).__name__.lower(), _names(action.members)]
    if isinstance(action, Penalize):
        return ["penalize", action.member.name]
    if isinstance(action, Plan):
        placed = action.placement
        encoder = placed.encoder.name if placed.encoder is not None else None
        members = {"prefill": placed.prefill.name, "decode": placed.decode.name, "encode": encoder}
        after = action.after.code if action.after is not None else None
        return ["plan", action.attempt, members, after]
    if isinstance(action, Send):
        return ["send", action.leg.value, action.member.name]
    if isinstance(action, Relay):
        return ["relay", action.member.name]
    assert isinstance(action, Finish)
    return ["finish", action.status, action.outcome, action.late]


def _exchange_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    listed = field(case, "members", dict)
    members: dict[str, list[Member[None]]] = {}
    for role in ("prefill", "decode", "encode"):
        names = field(listed, role, list, default=[])
        if not all(isinstance(name, str) for name in names):
            raise MalformedRequest("must be a list of names", param=f"members.{role}")
        members[role] = [Member(role, name, None) for name in names]
    events = [_event(e) for e in field(case, "events", list)]

    def place(excluded: tuple[str, ...]) -> Placement[None]:
        def first(role: str) -> Member[None]:
            for member in members[role]:
                if member.name not in excluded:
                    return member
            raise NoWorkerAvailable(role)

        return Placement(
            first("prefill"), first("decode"), first("encode") if members["encode"] else None
        )

    attempts = field(case, "attempts", int)
    if attempts < 1:
        raise MalformedRequest("must be a positive integer", param="attempts")
    exchange: Exchange[None] = Exchange(place, attempts=attempts)
    actions: list[list[Any]] = []
    for index, event in enumerate(events):
        try:
            answered = exchange.handle(event)
        except ExchangeError:
            return {"status": 500, "exchange_error": index, "actions": actions}
        actions += [_action(a) for a in answered]
    finish = exchange.finish
    if finish is None:
        return {"status": None, "actions": actions, "phase": exchange.phase.value}
    code = finish.error.code if finish.error is not None else None
    return {"status": finish.status, "error_code": code, "actions": actions}


#: The exchange's operation, by name.
EXCHANGE_OPERATIONS: Final = {"exchange": _exchange_outcome}

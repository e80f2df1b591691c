"""One client request's life through a router, as a state machine: events in, actions out.

Every router of this library (the HTTP proxy, ``FleetPd`` and the pair routers on gRPC,
the Ray decode server) drives an [`Exchange`][pd_policy.exchange.machine.Exchange] with the
I/O it does, and does what it is told next (the events and actions:
[`events`][pd_policy.exchange.events]). So each rule of a request's life is
written once, here:

- **Choice.** Each attempt's members come from one call to the router's placement (the
  core's [`place`][pd_policy.fleet.placement.place] over its roster), leaving out the members
  earlier attempts failed on.
- **Order.** An attempt runs its legs render, encode, prefill, decode, each at most once,
  skipping those its plan does not need; the render goes to the encoder in E/P/D, else
  to the prefill. A render or an encode needs a prefill after it.
- **Handoff.** The decode leg is never sent before the post-prefill check
  ([`check_kv_handoff`][pd_policy.handoff.check_kv_handoff]) passes (a stripped multimodal
  leg without a complete KV handoff: the 502), nor past the prefill's lease on its KV (the
  prefill leg failed: [`KvLeaseExpired`][pd_policy.kv_lease.KvLeaseExpired], retried).
- **Blame.** A failed leg is blamed on the member it was sent to, and on no other: that
  member is left out of the next attempt, and penalized (its health counts the failure)
  when the failure is the worker's (a worker error with a 5xx status).
- **Retry.** A failure is tried again, on a new choice, when its error may be retried,
  the client has seen no byte of the answer, and the budget (``attempts`` in all) is not
  spent. When the new choice finds no worker left, the client gets the failure that
  made it try.
- **First byte.** Once the client has seen a byte nothing is retried: a failure is the
  stream's last event.
- **End.** Success credits the attempt's members; every ending releases their load. A
  client that leaves, or a deadline that passes, ends it with no blame.

The states and the events each one takes are
[`TRANSITIONS`][pd_policy.exchange.machine.TRANSITIONS], the single source of the state diagram in
``docs/architecture.md``. An event a state does not take raises
[`ExchangeError`][pd_policy.exchange.machine.ExchangeError] and changes nothing. Pure: stdlib and
attrs; the placement callable is the router's (its roster's draw counter aside, it reads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Generic, TypeVar

from ..client_errors import RequestTimedOut
from ..errors import (
    InvalidConfiguration,
    MissingKvTransferParams,
    NoDecodeWorkerAvailable,
    NoWorkerAvailable,
    PolicyError,
)
from ..fleet.placement import Placement
from ..fleet.roster import Member, Roster
from ..handoff import check_kv_handoff
from ..kv_lease import KvLeaseExpired
from ..worker_errors import WorkerFailedToStart
from .events import (
    BEFORE_DECODE,
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
from .states import LEG_OF, PHASE_OF, TRANSITIONS, ExchangeError, Phase

__all__ = ["ONE_PAIR", "Exchange", "IoAction", "Placer", "fixed", "one_pair", "settle"]

W = TypeVar("W")

#: The router's placement: the members of an attempt, leaving out those named.
Placer = Callable[[tuple[str, ...]], Placement[W]]


def fixed(placement: Placement[W]) -> Placer[W]:
    """A placer that always answers ``placement``: a router of one pair (or one graph, as
    Ray's), which has nowhere else to go."""
    return lambda _excluded: placement


#: The placement of a router of one pair: its members are names, its bookkeeping nobody's.
ONE_PAIR: Final[Placement[None]] = Placement(
    Member("prefill", "prefill", None), Member("decode", "decode", None)
)


def one_pair() -> Exchange[None]:
    """The exchange of a request to a router of one pair (a pair router, Ray's graph): one
    attempt, on that pair, its bookkeeping ignored (``settle(None, ...)``)."""
    return Exchange(fixed(ONE_PAIR), attempts=1)


#: The action of a step that is I/O, or the finish.
IoAction = Plan[Any] | Send[Any] | Relay[Any] | Finish

# Built once: the exchange checks each step against them.
_LEG_EVENTS: Final = (LegAnswered, LegFailed)
_PLANNABLE: Final = frozenset(BEFORE_DECODE)
_BEFORE_PREFILL: Final = frozenset({Leg.RENDER, Leg.ENCODE})


def settle(roster: Roster[W] | None, actions: tuple[Action, ...]) -> IoAction:
    """Apply a step's bookkeeping to ``roster`` (a member's load held or released, its
    health penalized or credited) and return the step's one action that is I/O or the
    finish. A router without a roster (one pair, Ray's graph) passes ``None``: the
    bookkeeping is then not its to keep."""
    chosen: IoAction | None = None
    for action in actions:
        if isinstance(action, Hold | Release):
            if roster is not None:
                step = 1 if isinstance(action, Hold) else -1
                for member in action.members:
                    member.outstanding += step
        elif isinstance(action, Penalize):
            if roster is not None:
                roster.failed(action.member)
        elif isinstance(action, Credit):
            if roster is not None:
                for member in action.members:
                    roster.succeeded(member)
        else:
            chosen = action
    if chosen is None:
        raise ExchangeError("a step without an I/O action")  # every step has one
    return chosen


class Exchange(Generic[W]):
    """One client request through a router (see the module docs).

    ``place`` gives an attempt's members, leaving out the members named (the router's
    placement over its roster, or [`fixed`][pd_policy.exchange.machine.fixed]); it raises the
    policy's refusals and [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable].
    ``attempts`` is the budget: attempts in all, at least 1. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a budget that is
    not a positive integer.

    [`handle`][pd_policy.exchange.machine.Exchange.handle] takes each event and returns the
    actions it leads to; ``finish`` holds the last one once the exchange is over.
    """

    def __init__(self, place: Placer[W], *, attempts: int = 2) -> None:
        if type(attempts) is not int or attempts < 1:
            raise InvalidConfiguration("attempts must be a positive integer", param="attempts")
        self._place = place
        self.attempts = attempts
        self.phase = Phase.NEW
        #: The attempt under way (1 first; 0 before the exchange began).
        self.attempt = 0
        #: The members earlier attempts failed on, by name: left out of the next choice.
        self.excluded: tuple[str, ...] = ()
        #: The attempt's members, while it holds them.
        self.placement: Placement[W] | None = None
        self.finish: Finish | None = None
        self._legs: tuple[Leg, ...] = ()
        self._encodes = False
        self._check: HandoffCheck | None = None
        self._kv = KvFacts()

    @property
    def seen(self) -> bool:
        """Whether the client has seen a byte of the answer."""
        return self.phase is Phase.RESPONDING or bool(self.finish and self.finish.late)

    def handle(self, event: Event) -> tuple[Action, ...]:
        """The actions ``event`` leads to: bookkeeping, then one action that is I/O or the
        finish. Raises [`ExchangeError`][pd_policy.exchange.machine.ExchangeError] for an event the
        phase does not take (a leg's event for another leg than the one out included), and
        whatever ``place`` raises that is not a policy error."""
        allowed = TRANSITIONS[self.phase].get(type(event))
        if allowed is None:
            raise ExchangeError(f"{type(event).__name__} while {self.phase.value}")
        if isinstance(event, _LEG_EVENTS) and event.leg is not LEG_OF[self.phase]:
            raise ExchangeError(f"{event.leg.value} while {self.phase.value}")
        if isinstance(event, LegAnswered) and event.kv is not None and event.leg is not Leg.PREFILL:
            raise ExchangeError("only the prefill hands KV over")
        if isinstance(event, Planned):
            self._check_planned(event)
        actions = self._step(event)
        if self.phase not in allowed:  # the table and the rules disagree: a bug here
            raise ExchangeError(f"{type(event).__name__} led to {self.phase.value}")
        return actions

    def _check_planned(self, event: Planned) -> None:
        legs = event.legs
        if not legs <= _PLANNABLE:
            raise ExchangeError("a plan names the legs before the decode only")
        if legs & _BEFORE_PREFILL and Leg.PREFILL not in legs:
            raise ExchangeError("a render or an encode needs a prefill after it")
        assert self.placement is not None  # PLANNING holds one
        if Leg.ENCODE in legs and self.placement.encoder is None:
            raise ExchangeError("an encode leg needs an encoder among the members")

    def _step(self, event: Event) -> tuple[Action, ...]:
        if isinstance(event, Begin):
            self.attempt = 1
            return self._start(None, None)
        if isinstance(event, Planned):
            self._legs = tuple(leg for leg in BEFORE_DECODE if leg in event.legs)
            self._encodes = Leg.ENCODE in event.legs
            self._check, self._kv = event.check, event.kv
            return self._next()
        if isinstance(event, PlanFailed):
            return self._fail(event.error, None, None)
        if isinstance(event, LegAnswered):
            return self._answered(event)
        if isinstance(event, LegFailed):
            return self._fail(event.error, self._member(event.leg), event.leg)
        if isinstance(event, FirstByte):
            self.phase = Phase.RESPONDING
            return ()
        if isinstance(event, ClientLeft):
            return self._end(None, status=499, outcome="client_left")
        assert isinstance(event, DeadlinePassed)  # the last kind of event
        timed_out = RequestTimedOut()
        return self._end(timed_out, status=timed_out.status, outcome=timed_out.code)

    def _start(self, after: PolicyError | None, leg: Leg | None) -> tuple[Action, ...]:
        try:
            placement = self._place(self.excluded)
        except PolicyError as exc:
            if after is not None and isinstance(exc, NoWorkerAvailable | NoDecodeWorkerAvailable):
                exc = after  # no other worker to try: the failure that made it try
            return self._end(exc, status=exc.status, outcome=exc.code)
        self.placement, self.phase = placement, Phase.PLANNING
        return Hold(placement.members), Plan(self.attempt, placement, after, leg)

    def _member(self, leg: Leg) -> Member[W]:
        placement = self.placement
        assert placement is not None  # a leg is out only while an attempt holds members
        if (leg is Leg.RENDER and self._encodes) or leg is Leg.ENCODE:
            assert placement.encoder is not None  # checked when planned
            return placement.encoder
        return placement.decode if leg is Leg.DECODE else placement.prefill

    def _next(self) -> tuple[Action, ...]:
        if self._legs:
            leg = self._legs[0]
            self.phase = PHASE_OF[leg]
            return (Send(leg, self._member(leg)),)
        check, kv = self._check, self._kv
        assert check is not None  # set by Planned
        try:
            check_kv_handoff(
                check.form,
                has_mm_inputs=check.multimodal,
                kv_transfer_params=kv.params,
                kv_legacy=kv.legacy,
                mode=check.mode,
            )
        except MissingKvTransferParams as exc:
            return self._fail(exc, None, None)
        self.phase = Phase.DECODING
        return (Relay(self._member(Leg.DECODE)),)

    def _answered(self, event: LegAnswered) -> tuple[Action, ...]:
        if event.leg is Leg.DECODE:
            assert self.placement is not None
            members = self.placement.members
            self.phase, self.placement = Phase.DONE, None
            self.finish = Finish(200)
            return Release(members), Credit(members), self.finish
        if event.kv is not None:
            self._kv = event.kv
            if self._check is not None and self._check.lease_ran_out(event.kv):
                return self._fail(KvLeaseExpired(), self._member(Leg.PREFILL), Leg.PREFILL)
        self._legs = self._legs[1:]
        return self._next()

    def _fail(
        self, error: PolicyError, blamed: Member[W] | None, leg: Leg | None
    ) -> tuple[Action, ...]:
        actions: tuple[Action, ...] = ()
        # Held against the worker when it is the worker's fault: a worker error, a 5xx.
        if blamed is not None and isinstance(error, WorkerFailedToStart) and error.status >= 500:
            actions = (Penalize(blamed),)
        if error.retryable and not self.seen and self.attempt < self.attempts:
            actions = self._release() + actions
            if blamed is not None:
                self.excluded += (blamed.name,)
            self.attempt += 1
            return actions + self._start(error, leg)
        late = self.seen
        ended = self._end(error, status=200 if late else error.status, outcome=error.code)
        return ended[:-1] + actions + ended[-1:]

    def _release(self) -> tuple[Action, ...]:
        placement, self.placement = self.placement, None
        return (Release(placement.members),) if placement is not None else ()

    def _end(self, error: PolicyError | None, *, status: int, outcome: str) -> tuple[Action, ...]:
        late = self.seen
        self.finish = Finish(200 if late and error is not None else status, error, late, outcome)
        self.phase = Phase.FAILED
        return (*self._release(), self.finish)

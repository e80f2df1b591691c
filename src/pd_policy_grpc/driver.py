"""One request through a gRPC router: its [`Exchange`][pd_policy.exchange.machine.Exchange] driven
with the calls each action asks for, yielding the decode worker's responses.

Every router of this package drives it: a pair router
([`SequentialPd`][pd_policy_grpc.client.SequentialPd], on messages, and
[`SequentialPdBytes`][pd_policy_grpc.raw.client.SequentialPdBytes], on bytes) with its one
pair and one attempt, and [`FleetPd`][pd_policy_grpc.fleet.FleetPd] with a pair per
placement and its roster's bookkeeping. The rules (order, the handoff checked before the
decode, blame, retry, nothing retried once the caller has a response) are the exchange's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Final, Generic, Protocol, TypeVar

import attrs

from pd_policy import KvHandoff, Placement, PolicyError, Roster
from pd_policy.exchange import Exchange, one_pair, settle
from pd_policy.exchange.events import (
    Begin,
    ClientLeft,
    DeadlinePassed,
    Event,
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
from pd_policy.trace_context import passed_on

__all__ = ["Pair", "PairAttempt", "drive", "one_pair_of"]

L = TypeVar("L")
_PREFILL: Final = frozenset({Leg.PREFILL})
_NO_LEGS: Final[frozenset[Leg]] = frozenset()
_NO_KV: Final = KvFacts()
W = TypeVar("W")


@attrs.define
class PairAttempt(Generic[L]):
    """One attempt on a pair, up to its decode: the decode leg (a message, or a serialized
    leg) and the stub it goes to, whether a prefill runs first, the handoff check, the
    handoff planned, and the id both legs run (and are aborted) under: the router's own
    ([`router_request_id`][pd_policy_grpc.owned.router_request_id]), never the caller's."""

    leg: L
    decode: Any
    prefill: bool
    check: HandoffCheck
    handoff: KvHandoff
    request_id: str
    #: The gRPC metadata each leg carries: the caller's trace context
    #: ([`passed_on`][pd_policy.trace_context.passed_on]), so a worker's span joins its trace.
    metadata: tuple[tuple[str, str], ...] = ()


class Pair(Protocol):
    """What a pair router does for an attempt (``SequentialPd`` and ``SequentialPdBytes``)."""

    def attempt(self, request: Any) -> PairAttempt[Any]:
        """The attempt at ``request``: raises the policy's refusals before any call."""
        ...

    def handoff_of(self, attempt: PairAttempt[Any]) -> KvFacts:
        """The handoff the attempt's decode leg carries now."""
        ...

    async def prefill(self, request: Any, attempt: PairAttempt[Any]) -> None:
        """Run the prefill leg, and relay what it returned onto the decode leg."""
        ...

    def decode(self, request: Any, attempt: PairAttempt[Any]) -> AsyncGenerator[Any]:
        """The decode leg's responses."""
        ...


async def _next(stream: AsyncGenerator[Any], ends: float | None) -> Any:
    # The deadline bounds each wait, never a span with a yield in it: the caller runs there.
    # Without one, no timer: a streamed answer's every message would pay for it.
    if ends is None:
        return await anext(stream)
    async with asyncio.timeout_at(ends):
        return await anext(stream)


def _planned(pair: Pair, request: Any) -> tuple[Event, PairAttempt[Any] | None]:
    try:
        attempt = pair.attempt(request)
    except PolicyError as exc:
        return PlanFailed(exc), None
    if attempt.prefill:
        # The prefill's answer says what the decode leg carries: nothing to read yet.
        return Planned(_PREFILL, attempt.check, _NO_KV), attempt
    return Planned(_NO_LEGS, attempt.check, pair.handoff_of(attempt)), attempt


async def _prefilled(
    pair: Pair, request: Any, attempt: PairAttempt[Any], ends: float | None
) -> Event:
    try:
        if ends is None:
            await pair.prefill(request, attempt)
        else:
            async with asyncio.timeout_at(ends):
                await pair.prefill(request, attempt)
    except PolicyError as exc:
        return LegFailed(Leg.PREFILL, exc)
    return LegAnswered(Leg.PREFILL, pair.handoff_of(attempt))


def one_pair_of(request: Any) -> Exchange[None]:
    """The exchange of any request to a router of one pair (``drive``'s ``exchange_of``)."""
    return one_pair()


async def drive(
    data: Any,
    pair_of: Callable[[Placement[W]], Pair],
    exchange_of: Callable[[Any], Exchange[W]],
    roster: Roster[W] | None = None,
    *,
    read: Callable[[Any], Any] | None = None,
    deadline: float | None = None,
    trace_context: Mapping[str, str] | None = None,
) -> AsyncGenerator[Any]:
    """Serve a request through the exchange ``exchange_of`` makes for it, each attempt on the
    pair ``pair_of`` gives for its placement, applying the bookkeeping to ``roster``
    (``None``: a router of one pair). The request is ``data``, or what ``read`` makes of it
    (its errors raised on the first iteration, as the rest). Yields the decode's responses;
    raises the error the exchange finished with. ``deadline`` bounds the whole request in
    seconds (``None``: no bound). ``trace_context``: the caller's W3C trace headers (its
    call's metadata, or what OpenTelemetry's ``inject`` wrote), passed on to every leg
    when valid ([`passed_on`][pd_policy.trace_context.passed_on]).

    However the generator ends before its exchange does (the caller cancelled, closed it,
    or dropped it for the loop to close; an error that is not the policy's), the exchange
    ends as a client that left: the attempt's members are released, no one is blamed. A
    member's load never outlives the request that holds it.

    A router's ``generate`` returns this generator itself: a wrapping generator would cost
    every response of every request a hop."""
    request = read(data) if read is not None else data
    exchange = exchange_of(request)
    metadata = tuple(passed_on(trace_context).items()) if trace_context else ()
    loop = asyncio.get_running_loop()
    ends = None if deadline is None else loop.time() + deadline
    pair: Pair | None = None
    attempt: PairAttempt[Any] | None = None
    action = settle(roster, exchange.handle(Begin()))
    try:
        while not isinstance(action, Finish):
            event: Event | None = None
            if isinstance(action, Plan):
                pair = pair_of(action.placement)
                event, attempt = _planned(pair, request)
                if attempt is not None:
                    attempt.metadata = metadata
            elif isinstance(action, Send):
                assert pair is not None and attempt is not None
                event = await _prefilled(pair, request, attempt, ends)
            else:
                assert isinstance(action, Relay) and pair is not None and attempt is not None
                async with contextlib.aclosing(pair.decode(request, attempt)) as stream:
                    while event is None:
                        try:
                            response = await _next(stream, ends)
                        except StopAsyncIteration:
                            event = LegAnswered(Leg.DECODE)
                        except PolicyError as exc:
                            event = LegFailed(Leg.DECODE, exc)
                        else:
                            if not exchange.seen:
                                exchange.handle(FirstByte())
                            yield response
            action = settle(roster, exchange.handle(event))
    except TimeoutError:
        if exchange.finish is not None or ends is None or loop.time() < ends:
            raise
        action = settle(roster, exchange.handle(DeadlinePassed()))
    finally:
        if exchange.finish is None:
            settle(roster, exchange.handle(ClientLeft()))
    assert isinstance(action, Finish)
    if action.error is not None:
        raise action.error

"""The phases of an [`Exchange`][pd_policy.exchange.machine.Exchange] and the events each one takes.

[`TRANSITIONS`][pd_policy.exchange.states.TRANSITIONS] is the single source of the state
diagram in ``docs/architecture.md`` (``pd-policy tables exchange`` writes it), and every
step of an exchange is checked against it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from .events import (
    Begin,
    ClientLeft,
    DeadlinePassed,
    FirstByte,
    Leg,
    LegAnswered,
    LegFailed,
    PlanFailed,
    Planned,
)

__all__ = ["LEG_OF", "PHASE_OF", "TRANSITIONS", "ExchangeError", "Phase"]


class Phase(enum.Enum):
    """Where an exchange is."""

    # A member is a singleton that equals only itself: hashing it by identity is what
    # Enum's hash means, without its Python-level call on each of the exchange's steps.
    __hash__ = object.__hash__

    #: Not begun.
    NEW = "new"
    #: Members chosen; the router plans the attempt on them.
    PLANNING = "planning"
    RENDERING = "rendering"
    ENCODING = "encoding"
    PREFILLING = "prefilling"
    #: The decode leg is out; the client has seen nothing yet.
    DECODING = "decoding"
    #: The client has seen output: nothing is retried from here.
    RESPONDING = "responding"
    DONE = "done"
    FAILED = "failed"


#: The phase each leg is out in.
PHASE_OF: Final = {
    Leg.RENDER: Phase.RENDERING,
    Leg.ENCODE: Phase.ENCODING,
    Leg.PREFILL: Phase.PREFILLING,
    Leg.DECODE: Phase.DECODING,
}
#: The leg out in each phase (the decode's in two: before and after the first byte).
LEG_OF: Final = {phase: leg for leg, phase in PHASE_OF.items()} | {Phase.RESPONDING: Leg.DECODE}
_ENDS: Final = frozenset({Phase.FAILED})
_ANYTIME: Final = {ClientLeft: _ENDS, DeadlinePassed: _ENDS}

#: Each phase, the events it takes, and the phases each may lead to. The docs' state
#: diagram is generated from it; the exchange checks every step against it.
TRANSITIONS: Final[Mapping[Phase, Mapping[type[Any], frozenset[Phase]]]] = MappingProxyType(
    {
        Phase.NEW: {Begin: frozenset({Phase.PLANNING, Phase.FAILED}), **_ANYTIME},
        Phase.PLANNING: {
            Planned: frozenset(
                {Phase.RENDERING, Phase.ENCODING, Phase.PREFILLING, Phase.DECODING, Phase.FAILED}
            ),
            PlanFailed: frozenset({Phase.PLANNING, Phase.FAILED}),
            **_ANYTIME,
        },
        Phase.RENDERING: {
            LegAnswered: frozenset({Phase.ENCODING, Phase.PREFILLING}),
            LegFailed: frozenset({Phase.PLANNING, Phase.FAILED}),
            **_ANYTIME,
        },
        Phase.ENCODING: {
            LegAnswered: frozenset({Phase.PREFILLING}),
            LegFailed: frozenset({Phase.PLANNING, Phase.FAILED}),
            **_ANYTIME,
        },
        Phase.PREFILLING: {
            # To planning: the answer came past the prefill's lease on its KV, tried again.
            LegAnswered: frozenset({Phase.DECODING, Phase.PLANNING, Phase.FAILED}),
            LegFailed: frozenset({Phase.PLANNING, Phase.FAILED}),
            **_ANYTIME,
        },
        Phase.DECODING: {
            FirstByte: frozenset({Phase.RESPONDING}),
            LegAnswered: frozenset({Phase.DONE}),
            LegFailed: frozenset({Phase.PLANNING, Phase.FAILED}),
            **_ANYTIME,
        },
        Phase.RESPONDING: {
            LegAnswered: frozenset({Phase.DONE}),
            LegFailed: frozenset({Phase.FAILED}),
            **_ANYTIME,
        },
        Phase.DONE: {},
        Phase.FAILED: {},
    }
)


class ExchangeError(RuntimeError):
    """A router reported an event its exchange's phase does not take: a bug of the
    router's, never of the request's (as h11's ``LocalProtocolError``). The exchange is
    unchanged."""

    #: The status a gateway answers a request it mishandled with.
    error_status_hint: Final = 500

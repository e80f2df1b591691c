"""What goes into an [`Exchange`][pd_policy.exchange.machine.Exchange] and what comes out of it.

An exchange is one client request's life through a router, written as h11 writes a
connection: the router reports what happened (an *event*: a leg answered, a leg failed,
the first byte reached the client, the client left, the deadline passed) and is told
what to do next (an *action*: plan the attempt on these members, send this leg to this
member, relay the decode, finish with this status). Bookkeeping actions (hold and
release a member's load, penalize or credit its health) come with them, for the
router's roster ([`settle`][pd_policy.exchange.machine.settle]).

Every type here is frozen data: the rules are in [`exchange`][pd_policy.exchange].
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final, Generic, TypeVar

import attrs

from ..connectors import KvConnectorMode
from ..decision import DecodeForm
from ..errors import PolicyError
from ..fleet.placement import Placement
from ..fleet.roster import Member
from ..kv_lease import KvLeaseExpired, check_kv_lease

__all__ = [
    "Action",
    "Begin",
    "ClientLeft",
    "Credit",
    "DeadlinePassed",
    "Event",
    "Finish",
    "FirstByte",
    "HandoffCheck",
    "Hold",
    "KvFacts",
    "Leg",
    "LegAnswered",
    "LegFailed",
    "Penalize",
    "Plan",
    "PlanFailed",
    "Planned",
    "Relay",
    "Release",
    "Send",
]

W = TypeVar("W")


class Leg(enum.Enum):
    """A leg of an attempt, in the order the legs run (any but the decode may be skipped)."""

    __hash__ = object.__hash__  # as Phase's (states.py): identity, at C speed

    #: The request rendered by a worker (the M-RoPE metadata path, E/P/D): the encoder's
    #: in E/P/D, else the prefill's.
    RENDER = "render"
    ENCODE = "encode"
    PREFILL = "prefill"
    DECODE = "decode"


#: The legs a plan may ask for before the decode, in the order they run.
BEFORE_DECODE: Final = (Leg.RENDER, Leg.ENCODE, Leg.PREFILL)


@attrs.frozen(slots=True)
class KvFacts:
    """The KV handoff a decode leg carries: its JSON parameters (an object, or its text)
    and its typed legacy ``(remote_host, remote_port)``, as
    [`check_kv_handoff`][pd_policy.handoff.check_kv_handoff] reads them; and its ``age``:
    the seconds from when the router sent the prefill leg to when it read the answer
    (what [`check_kv_lease`][pd_policy.kv_lease.check_kv_lease] reads; 0 before any
    prefill answered)."""

    params: str | Mapping[str, Any] | None = None
    legacy: tuple[str, int] | None = None
    age: float = 0.0


@attrs.frozen(slots=True)
class HandoffCheck:
    """What the post-prefill check needs to know of an attempt's plan: the decode ``form``,
    whether the request is ``multimodal``, the prefill's handoff contract, and its
    ``lease`` on the KV it hands over, in seconds (``None``: none,
    [`KvHandoff`][pd_policy.connectors.KvHandoff])."""

    form: DecodeForm
    multimodal: bool
    mode: KvConnectorMode
    lease: float | None = None

    def lease_ran_out(self, kv: KvFacts) -> bool:
        """Whether the handoff ``kv`` a prefill answered with came too late to relay: its
        age leaves no more than the margin of the prefill's lease
        ([`check_kv_lease`][pd_policy.kv_lease.check_kv_lease]). A prefill that handed
        nothing over (no parameters) leaves nothing to expire."""
        try:
            check_kv_lease(self.lease if kv.params is not None else None, kv.age)
        except KvLeaseExpired:
            return True
        return False


# --- events ------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Begin:
    """The request arrived (checked and read): the exchange chooses its first members."""


@attrs.frozen(slots=True)
class Planned:
    """The router planned the attempt on the members of its [`Plan`][
    pd_policy.exchange.events.Plan]: the ``legs`` it needs before the decode (a subset of
    render, encode and prefill), the handoff ``check`` and the handoff the decode leg
    carries before any prefill answers (``kv``: a minted transfer, say)."""

    legs: frozenset[Leg]
    check: HandoffCheck
    kv: KvFacts = KvFacts()


@attrs.frozen(slots=True)
class PlanFailed:
    """The router could not plan the attempt: a refusal of the policy's, or a media item it
    could not fetch."""

    error: PolicyError


@attrs.frozen(slots=True)
class LegAnswered:
    """``leg`` answered, and the router read the answer as the next step needs it. For the
    prefill, ``kv`` is the handoff the decode leg carries now (what the prefill returned,
    relayed; ``None`` keeps the planned one). For the decode, the answer is whole: the
    client has all of it."""

    leg: Leg
    kv: KvFacts | None = None


@attrs.frozen(slots=True)
class LegFailed:
    """``leg`` failed: its worker could not be reached, refused it, broke its answer, or
    answered what the next step cannot use. ``error`` says how."""

    leg: Leg
    error: PolicyError


@attrs.frozen(slots=True)
class FirstByte:
    """The first byte of the decode's answer went to the client: nothing is retried now."""


@attrs.frozen(slots=True)
class ClientLeft:
    """The client went away: every leg in flight is abandoned."""


@attrs.frozen(slots=True)
class DeadlinePassed:
    """The request's deadline passed."""


#: What a router reports.
Event = (
    Begin | Planned | PlanFailed | LegAnswered | LegFailed | FirstByte | ClientLeft | DeadlinePassed
)


# --- actions -----------------------------------------------------------------------


@attrs.frozen(slots=True)
class Plan(Generic[W]):
    """Plan ``attempt`` (1 first) on ``placement``'s members, and report
    [`Planned`][pd_policy.exchange.events.Planned] or
    [`PlanFailed`][pd_policy.exchange.events.PlanFailed]. ``after`` is the error that made
    the exchange try again (``None`` for the first attempt), and ``leg`` the leg it came
    from (``None`` when planning failed)."""

    attempt: int
    placement: Placement[W]
    after: PolicyError | None = None
    leg: Leg | None = None


@attrs.frozen(slots=True)
class Send(Generic[W]):
    """Send ``leg`` (render, encode or prefill) to ``member``; report its answer or its
    failure."""

    leg: Leg
    member: Member[W]


@attrs.frozen(slots=True)
class Relay(Generic[W]):
    """Send the decode leg to ``member`` and relay its answer to the client: report
    [`FirstByte`][pd_policy.exchange.events.FirstByte] when the first byte goes out, then
    the decode's end or failure."""

    member: Member[W]


@attrs.frozen(slots=True)
class Finish:
    """The exchange is over. ``status`` is what the client was (or is) answered with;
    ``error`` the typed error, ``None`` on success; ``late`` when the client had already
    seen output, so the error is the stream's last event (``status`` is then 200);
    ``outcome`` what logs and metrics count: ``ok``, the error's code, or
    ``client_left``."""

    status: int
    error: PolicyError | None = None
    late: bool = False
    outcome: str = "ok"


@attrs.frozen(slots=True)
class Hold(Generic[W]):
    """The attempt's members each carry one more request."""

    members: tuple[Member[W], ...]


@attrs.frozen(slots=True)
class Release(Generic[W]):
    """The attempt's members each carry one request less."""

    members: tuple[Member[W], ...]


@attrs.frozen(slots=True)
class Penalize(Generic[W]):
    """A leg failed on ``member`` for a reason of the worker's: it counts against its
    health ([`leg_failed`][pd_policy.fleet.health.leg_failed])."""

    member: Member[W]


@attrs.frozen(slots=True)
class Credit(Generic[W]):
    """The request succeeded on ``members``: their failures in a row are forgotten."""

    members: tuple[Member[W], ...]


#: What the exchange asks of a router. Exactly one action of a step is I/O (plan, send,
#: relay) or the finish; the others are bookkeeping.
Action = (
    Plan[Any]
    | Send[Any]
    | Relay[Any]
    | Finish
    | Hold[Any]
    | Release[Any]
    | Penalize[Any]
    | Credit[Any]
)

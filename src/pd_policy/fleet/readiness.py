"""Whether a router is ready for traffic: the rule a readiness probe asks.

A router is ready when it is not draining and it could route a request now: at least
one routable prefill and one routable decode (an encoder is a fleet's option, not a
need: without one, media goes the P/D way). Liveness is another question (the process
serves); a router that is not ready is still alive, and must not be restarted for it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import attrs

from .health import routable
from .roster import Member

W = TypeVar("W")

__all__ = ["NEEDED_ROLES", "Readiness", "readiness"]

#: The roles a router cannot route without.
NEEDED_ROLES = ("prefill", "decode")


@attrs.frozen(slots=True)
class Readiness:
    """Whether the router is ready, and each reason it is not, in words for an operator."""

    ready: bool
    why_not: tuple[str, ...] = ()


def readiness(members: Iterable[Member[W]], *, draining: bool) -> Readiness:
    """The router's readiness over its ``members`` (a snapshot) while ``draining`` or not:
    not ready while draining, or while a needed role has no routable member."""
    routable_roles = {m.role for m in members if routable(m.health)}
    why = ["draining: stopping, its requests in flight finishing"] if draining else []
    why += [f"no routable {role} worker" for role in NEEDED_ROLES if role not in routable_roles]
    return Readiness(not why, tuple(why))

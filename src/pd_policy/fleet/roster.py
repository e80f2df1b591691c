"""What a router keeps about its fleet: the members by role, each one's health and load.

The state a router must keep, and nothing else. Each [`Member`][pd_policy.fleet.roster.Member]
holds the adapter's description of a worker (a URL and its capability, a gRPC channel
and its info), its health ([`HealthState`][pd_policy.fleet.health.HealthState], moved only
by the core's transitions) and its outstanding requests. Choosing is
[`choose`][pd_policy.fleet.balance.choose] over snapshots of the members; the events (a leg
succeeded or failed, a probe) come from the adapter. There is no I/O here and no clock
of its own: ``clock`` is passed in. One event loop owns a roster, so it takes no lock.

A member's ``name`` is what logs and metric labels show, and the key of its
rendezvous order: the adapter makes it from the worker's address without credentials
or path, so it never holds a key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Final, Generic, TypeVar

import attrs

from .balance import DEFAULT_BOUND, Balance, WorkerSnapshot, choose
from .health import (
    Health,
    HealthPolicy,
    HealthState,
    drain,
    leg_failed,
    leg_succeeded,
    probe_failed,
    readmit,
    routable,
)

__all__ = ["ROLES", "Member", "Roster"]

W = TypeVar("W")

#: The roles a worker can have in a fleet.
ROLES: Final = ("prefill", "decode", "encode")


@attrs.define
class Member(Generic[W]):
    """One worker of the fleet: its ``role``, its ``name`` (no credentials), what the
    adapter knows of it (``worker``), its health and its outstanding requests."""

    role: str
    name: str
    worker: W
    health: HealthState = attrs.field(factory=HealthState)
    outstanding: int = 0


class Roster(Generic[W]):
    """The members, and the rules they are chosen and ejected by.

    ``clock`` gives monotonic seconds. ``on_change`` is called with a member whose
    health changed and its health before (metrics and logs follow it). ``generation``
    counts the changes of who the members are and what they were described as (a join,
    a removal, a member described anew): what an adapter keeps per member (a router per
    pair) is stale when it was built at another generation.
    """

    def __init__(
        self,
        *,
        policy: HealthPolicy | None = None,
        balance: Balance = Balance.LEAST_OUTSTANDING,
        bound: float = DEFAULT_BOUND,
        clock: Callable[[], float],
        on_change: Callable[[Member[W], Health], None] | None = None,
    ) -> None:
        self.policy = policy if policy is not None else HealthPolicy()
        self.balance, self.bound, self.clock = balance, bound, clock
        self._members: list[Member[W]] = []
        self.on_change = on_change
        self._draws = 0
        self._turns: dict[str, int] = {}
        self.generation = 0

    def __iter__(self) -> Iterator[Member[W]]:
        return iter(list(self._members))

    def of(self, role: str) -> list[Member[W]]:
        """The members of ``role``, in the order they joined."""
        return [m for m in self._members if m.role == role]

    def named(self, name: str) -> Member[W] | None:
        """The member called ``name``, if any."""
        return next((m for m in self._members if m.name == name), None)

    def join(self, member: Member[W]) -> Member[W]:
        """Add ``member``, replacing one of its name. Raises ``ValueError`` for a role
        outside [`ROLES`][pd_policy.fleet.roster.ROLES]."""
        if member.role not in ROLES:
            raise ValueError(f"unknown role {member.role!r}")
        old = self.named(member.name)
        if old is not None:
            self._members.remove(old)
        self._members.append(member)
        self.generation += 1
        return member

    def add_member(self, role: str, name: str, worker: W, *, healthy: bool = True) -> Member[W]:
        """A ``role`` member called ``name`` joins (replacing one of its name): in service at
        once when ``healthy`` (the adapter has just read its description from the worker
        itself, which is a passed probe), else starting until a probe passes. Raises
        ``ValueError`` for a role outside [`ROLES`][pd_policy.fleet.roster.ROLES]."""
        health = HealthState(Health.HEALTHY) if healthy else HealthState()
        return self.join(Member(role, name, worker, health))

    def remove(self, member: Member[W]) -> None:
        """Forget ``member`` (its in-flight requests finish on their own)."""
        if member in self._members:
            self._members.remove(member)
            self.generation += 1

    def _set(self, member: Member[W], state: HealthState) -> None:
        before = member.health.health
        member.health = state
        if state.health is not before and self.on_change is not None:
            self.on_change(member, before)

    def drain(self, member: Member[W]) -> None:
        """No new request goes to ``member``."""
        self._set(member, drain(member.health))

    def succeeded(self, member: Member[W]) -> None:
        """A leg succeeded on ``member``."""
        self._set(member, leg_succeeded(member.health))

    def failed(self, member: Member[W]) -> None:
        """A leg failed on ``member`` before its answer began (unreachable, or a 5xx)."""
        self._set(member, leg_failed(member.health, self.policy, self.clock()))

    def probe_failed(self, member: Member[W]) -> None:
        """A probe of ``member`` failed."""
        self._set(member, probe_failed(member.health, self.policy, self.clock()))

    def readmit(self, member: Member[W], worker: W) -> None:
        """A probe of ``member`` passed and it was described anew as ``worker``: it is what
        it is now, and routed to again once its ejection has run its time."""
        member.worker = worker
        self._set(member, readmit(member.health, self.clock()))

    def redescribe(self, member: Member[W], worker: W) -> None:
        """``member`` was described anew while in service: it is routed as what it is now."""
        member.worker = worker
        self.generation += 1

    def choose(
        self,
        role: str,
        compatible: Sequence[Member[W]],
        *,
        affinity: str | None = None,
        exclude: Sequence[str] = (),
        cached: Mapping[str, int] | None = None,
    ) -> Member[W]:
        """The member of ``compatible`` (those that can serve the leg) that takes it, by
        [`choose`][pd_policy.fleet.balance.choose]; ``exclude`` names the members an earlier
        attempt of the request failed on, ``cached`` how many of its leading KV blocks
        each member holds, by name. Raises
        [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable] (503, retryable)."""
        held = cached or {}
        snapshots = [
            WorkerSnapshot(
                m.name,
                m,
                routable(m.health) and m.name not in exclude,
                m.outstanding,
                held.get(m.name, 0),
            )
            for m in compatible
        ]
        self._draws += 1
        turn = self._turns[role] = self._turns.get(role, -1) + 1
        # Two "random" draws: a counter mixed by two odd constants spreads them, and keeps
        # the roster free of a random source a test would have to seed.
        draws = (self._draws * 0x9E3779B1 >> 7, self._draws * 0x85EBCA77 >> 9)
        chosen = choose(
            snapshots,
            role=role,
            affinity=affinity,
            bound=self.bound,
            balance=self.balance,
            draws=draws,
            turn=turn,
        )
        return chosen.handle

"""The proxy's fleet: every worker it may route to, by role, with its health and its load.

The state a router must keep, and nothing else: each member's description (what it
is now), its health ([`pd_policy.HealthState`][pd_policy.health.HealthState], moved
by the core's transitions) and its outstanding requests. Choosing is the core's
([`pd_policy.choose`][pd_policy.balance.choose]) over snapshots of the members; the
events (a leg done, a leg failed, a probe) come from the proxy and the prober. One
event loop owns it, so it takes no lock.

A member's ``name`` is its URL without credentials or path (``http://host:port``):
what logs and metric labels show, never a key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Final
from urllib.parse import urlsplit

import attrs

from pd_policy import (
    DEFAULT_BOUND,
    Balance,
    Health,
    HealthPolicy,
    HealthState,
    WorkerSnapshot,
    choose,
    drain,
    leg_failed,
    leg_succeeded,
    probe_failed,
    readmit,
    routable,
)
from pd_policy_vllm.http.workers import HttpWorker

__all__ = ["ROLES", "Fleet", "Member", "member_name"]

#: The roles a worker can have in the fleet.
ROLES: Final = ("prefill", "decode", "encode")


def member_name(url: str) -> str:
    """``scheme://host:port`` of ``url``: no credentials, no path (an IPv6 host in
    brackets)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}"


@attrs.define
class Member:
    """One worker of the fleet."""

    role: str
    worker: HttpWorker
    health: HealthState = attrs.field(factory=HealthState)
    outstanding: int = 0

    @property
    def name(self) -> str:
        """The worker's URL without credentials or path."""
        return member_name(self.worker.url)

    @property
    def url(self) -> str:
        return self.worker.url


class Fleet:
    """The members, and the rules they are chosen and ejected by.

    ``clock`` gives monotonic seconds (tests pass their own). ``on_change`` is called
    with a member whose health changed (the metrics and the log follow it).
    """

    def __init__(
        self,
        *,
        policy: HealthPolicy | None = None,
        balance: Balance = Balance.LEAST_OUTSTANDING,
        bound: float = DEFAULT_BOUND,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[Member, Health], None] | None = None,
    ) -> None:
        self.policy = policy if policy is not None else HealthPolicy()
        self.balance, self.bound, self.clock = balance, bound, clock
        self._members: list[Member] = []
        #: Called with a member whose health changed, and its health before.
        self.on_change = on_change
        self._draws = 0

    def __iter__(self) -> Iterator[Member]:
        return iter(list(self._members))

    def of(self, role: str) -> list[Member]:
        """The members of ``role``, in the order they joined."""
        return [m for m in self._members if m.role == role]

    def find(self, url: str) -> Member | None:
        """The member at ``url`` (its base URL), if any."""
        url = url.rstrip("/")
        return next((m for m in self._members if m.url == url), None)

    def add(self, role: str, worker: HttpWorker, *, healthy: bool = False) -> Member:
        """Add ``worker`` as a ``role`` member (replacing one at its URL), starting until a
        probe passes, or ``healthy`` at once (its description was just read)."""
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}")
        old = self.find(worker.url)
        if old is not None:
            self._members.remove(old)
        health = HealthState(Health.HEALTHY) if healthy else HealthState()
        member = Member(role, worker, health)
        self._members.append(member)
        return member

    def remove(self, member: Member) -> None:
        """Forget ``member`` (its in-flight requests finish on their own)."""
        if member in self._members:
            self._members.remove(member)

    def _set(self, member: Member, state: HealthState) -> None:
        before = member.health.health
        member.health = state
        if state.health is not before and self.on_change is not None:
            self.on_change(member, before)

    def drain(self, member: Member) -> None:
        """No new request goes to ``member``."""
        self._set(member, drain(member.health))

    def succeeded(self, member: Member) -> None:
        """A leg succeeded on ``member``."""
        self._set(member, leg_succeeded(member.health))

    def failed(self, member: Member) -> None:
        """A leg failed on ``member`` before its answer began (unreachable, or a 5xx)."""
        self._set(member, leg_failed(member.health, self.policy, self.clock()))

    def probe_failed(self, member: Member) -> None:
        """A probe of ``member`` failed."""
        self._set(member, probe_failed(member.health, self.policy, self.clock()))

    def readmit(self, member: Member, worker: HttpWorker) -> None:
        """A probe of ``member`` passed and it was described anew as ``worker``: it is what
        it is now, and routed to again once its ejection has run its time."""
        member.worker = worker
        self._set(member, readmit(member.health, self.clock()))

    def redescribe(self, member: Member, worker: HttpWorker) -> None:
        """``member`` was described anew while in service: it is routed as what it is now."""
        member.worker = worker

    def choose(
        self, role: str, compatible: Sequence[Member], *, affinity: str | None = None,
        exclude: Sequence[str] = (),
    ) -> Member:  # fmt: skip
        """The member of ``compatible`` (those that can serve the leg) that takes it, by
        the core's rules; ``exclude`` names the members an earlier attempt failed on.
        Raises [`NoWorkerAvailable`][pd_policy.errors.NoWorkerAvailable] (503)."""
        snapshots = [
            WorkerSnapshot(m.name, m, routable(m.health) and m.name not in exclude, m.outstanding)
            for m in compatible
        ]
        self._draws += 1
        # Two "random" draws: a counter mixed by two odd constants suffices to spread them.
        draws = (self._draws * 0x9E3779B1 >> 7, self._draws * 0x85EBCA77 >> 9)
        chosen = choose(snapshots, role=role, affinity=affinity, bound=self.bound,
                        balance=self.balance, draws=draws)  # fmt: skip
        return chosen.handle

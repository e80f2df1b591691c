"""The proxy's fleet: the core's [`Roster`][pd_policy.fleet.roster.Roster] of HTTP workers.

A member is an [`HttpWorker`][pd_policy_vllm.openai.workers.HttpWorker] (its URL and what
its server said it is), named by its URL without credentials or path
(``http://host:port``): what logs and metric labels show, never a key.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TypeAlias
from urllib.parse import urlsplit

from pd_policy import (
    DEFAULT_BOUND,
    ROLES,
    Balance,
    Health,
    HealthPolicy,
    InvalidConfiguration,
    Roster,
    RosterMember,
)
from pd_policy.authority import authority, host_of_url, worker_url
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["ROLES", "Fleet", "Member", "member_name"]

#: A member of the proxy's fleet.
Member: TypeAlias = RosterMember[HttpWorker]


def member_name(url: str) -> str:
    """``scheme://host:port`` of ``url`` (a worker address, read as
    [`worker_url`][pd_policy.authority.worker_url] reads it): no credentials, no path, an
    IPv6 host in brackets. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] as ``worker_url``
    does."""
    url = worker_url(url)
    parts = urlsplit(url)
    return f"{parts.scheme}://{authority(host_of_url(url), parts.port)}"


class Fleet(Roster[HttpWorker]):
    """The proxy's members, by URL. ``clock`` gives monotonic seconds (tests pass their
    own); ``on_change`` is called with a member whose health changed."""

    def __init__(
        self,
        *,
        policy: HealthPolicy | None = None,
        balance: Balance = Balance.LEAST_OUTSTANDING,
        bound: float = DEFAULT_BOUND,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[Member, Health], None] | None = None,
    ) -> None:
        super().__init__(
            policy=policy, balance=balance, bound=bound, clock=clock, on_change=on_change
        )

    def find(self, url: str) -> Member | None:
        """The member at ``url`` (any URL of its host and port), if any: none for an
        address no worker could have."""
        try:
            return self.named(member_name(url))
        except InvalidConfiguration:
            return None

    def add(self, role: str, worker: HttpWorker, *, healthy: bool = True) -> Member:
        """Add ``worker`` as a ``role`` member named by its URL (replacing one at its
        address), in service at once: its description was just read (``healthy=False``:
        starting until a probe passes). Raises ``ValueError`` for an unknown role."""
        return self.add_member(role, member_name(worker.url), worker, healthy=healthy)

    @classmethod
    def pair(
        cls, prefill: HttpWorker, decode: Sequence[HttpWorker], encoder: HttpWorker | None = None
    ) -> Fleet:
        """A fixed fleet: ``prefill``, ``decode`` and an optional ``encoder``, each taken as
        healthy (never probed)."""
        fleet = cls()
        for role, workers in (
            ("prefill", [prefill]),
            ("decode", decode),
            ("encode", [encoder] if encoder else []),
        ):
            for worker in workers:
                fleet.add(role, worker)
        return fleet

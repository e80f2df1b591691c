"""Active health checks, as rules: which members a router probes, and what each answer does.

A router probes its fleet every so often: a health check per member (vLLM's ``/health``,
the engine's ``HealthCheck``), and, for a member that passes, its description read anew
when it is coming back or its description is old, since a worker may come back as
another kind (restarted with ``--language-model-only``, say). The I/O is the adapter's;
the rules are here, one prober for every router:

- a draining member that holds no request leaves the roster; one that holds some is not
  probed;
- a member out of service is probed only once its ejection has run its time (or while it
  is starting);
- a failed check ejects a member in service at once, and an ejected one for longer;
- a passed check is followed by a description when the member is not in service, or its
  last description is ``redescribe`` seconds old; a description that cannot be read
  counts as a failed check;
- a description read re-admits a member coming back, and replaces what a member in
  service was described as (the roster's generation moves, so an adapter's per-member
  state is rebuilt).

Nothing here reads a clock or does I/O: the roster's clock is the one time source.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs

from .health import Health, routable
from .roster import Member, Roster

__all__ = ["ProbeTimes", "Prober"]

W = TypeVar("W")


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attr.name} must be positive, not {value!r}")


@attrs.frozen(slots=True)
class ProbeTimes:
    """How often a router probes (``interval``), how long a probe may take (``timeout``),
    and how old a description may get before it is read anew (``redescribe``), in
    seconds. Raises ``ValueError`` for one that is not positive."""

    interval: float = attrs.field(default=2.0, validator=_positive)
    timeout: float = attrs.field(default=2.0, validator=_positive)
    redescribe: float = attrs.field(default=30.0, validator=_positive)


class Prober(Generic[W]):
    """The probing of ``roster`` (see the module docs): ask [`round`][
    pd_policy.fleet.probing.Prober.round] for the members to check, report each check with
    [`checked`][pd_policy.fleet.probing.Prober.checked], and, when it says so, the description
    read with [`described`][pd_policy.fleet.probing.Prober.described]."""

    def __init__(self, roster: Roster[W], times: ProbeTimes | None = None) -> None:
        self.roster = roster
        self.times = times if times is not None else ProbeTimes()
        self._described: dict[str, float] = {}

    def round(self) -> list[Member[W]]:
        """The members to check now; draining members that hold no request leave."""
        now = self.roster.clock()
        due = []
        for member in self.roster:
            if member.health.health is Health.DRAINING:
                if member.outstanding == 0:
                    self.roster.remove(member)
                    self._described.pop(member.name, None)
                continue
            if routable(member.health) or member.health.probe_due(now):
                due.append(member)
        return due

    def checked(self, member: Member[W], healthy: bool) -> bool:
        """Record ``member``'s health check; ``True`` when it must be described anew now
        (report the description with ``described``)."""
        if not healthy:
            self.roster.probe_failed(member)
            return False
        age = self.roster.clock() - self._described.get(member.name, float("-inf"))
        return not routable(member.health) or age >= self.times.redescribe

    def described(self, member: Member[W], worker: W | None) -> None:
        """``member``'s description, read anew as ``worker``; ``None`` when it could not be
        read (a failed check)."""
        if worker is None:
            self.roster.probe_failed(member)
            return
        self._described[member.name] = self.roster.clock()
        if routable(member.health):
            self.roster.redescribe(member, worker)
        else:
            self.roster.readmit(member, worker)

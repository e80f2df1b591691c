"""A worker's health, as the router sees it: a small state machine, with time passed in.

A router learns a worker's health two ways: actively, by probing it (vLLM's
``/health``, the gRPC health service), and passively, from the legs it sends (a
connection refused, a 5xx). Both are events here; the state says whether the worker
may be routed to. Nothing here reads a clock or does I/O: the adapter passes ``now``
(monotonic seconds) and acts on the answer.

- ``STARTING``: registered, not yet seen healthy; not routed to.
- ``HEALTHY``: routed to.
- ``EJECTED``: it failed; not routed to until a probe after ``until`` passes. Each
  ejection in a row doubles the wait, up to the policy's maximum; a success resets it.
- ``DRAINING``: it is leaving (its operator removed it, or it is shutting down); no
  new request goes to it, and its in-flight ones finish.

A worker that comes back may come back as another kind (restarted with
``--language-model-only``, say): the adapter describes it anew before it reports the
probe that re-admits it ([`readmit`][pd_policy.fleet.health.readmit]).
"""

from __future__ import annotations

import enum

import attrs

from ..errors import MalformedRequest
from ..fields import instance_of

__all__ = [
    "Health",
    "HealthPolicy",
    "HealthState",
    "drain",
    "eject",
    "leg_failed",
    "leg_succeeded",
    "probe_failed",
    "readmit",
    "routable",
]


class Health(enum.Enum):
    """Whether a worker may be routed to, and why not."""

    STARTING = "starting"
    HEALTHY = "healthy"
    EJECTED = "ejected"
    DRAINING = "draining"


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if type(value) not in (int, float) or not value > 0:
        raise MalformedRequest(f"{attr.name} must be a positive number", param=attr.name)


def _count(_inst: object, attr: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 1:
        raise MalformedRequest(f"{attr.name} must be a positive integer", param=attr.name)


@attrs.frozen(slots=True)
class HealthPolicy:
    """When a worker is ejected, and for how long.

    ``failures`` legs in a row that fail on the worker (a connection error, a 5xx) eject
    it; a failed probe ejects it at once. The first ejection lasts ``backoff`` seconds,
    each one after it in a row twice as long, at most ``max_backoff``.
    """

    failures: int = attrs.field(default=3, validator=_count)
    backoff: float = attrs.field(default=1.0, validator=_positive)
    max_backoff: float = attrs.field(default=30.0, validator=_positive)

    def wait(self, ejections: int) -> float:
        """Seconds the ``ejections``-th ejection in a row lasts (the first is 1)."""
        return float(min(self.backoff * 2 ** max(ejections - 1, 0), self.max_backoff))


@attrs.frozen(slots=True)
class HealthState:
    """One worker's health. ``failed`` counts the legs in a row that failed on it,
    ``ejections`` the ejections in a row, ``until`` when the current ejection ends."""

    health: Health = attrs.field(default=Health.STARTING, validator=instance_of(Health))
    failed: int = 0
    ejections: int = 0
    until: float = 0.0

    def probe_due(self, now: float) -> bool:
        """Whether a probe now could re-admit it: starting, or ejected and its wait over."""
        if self.health is Health.STARTING:
            return True
        return self.health is Health.EJECTED and now >= self.until


def routable(state: HealthState) -> bool:
    """Whether a new request may go to the worker."""
    return state.health is Health.HEALTHY


def eject(state: HealthState, policy: HealthPolicy, now: float) -> HealthState:
    """The worker ejected now, for as long as its ejections in a row say. A draining
    worker stays draining."""
    if state.health is Health.DRAINING:
        return state
    ejections = state.ejections + 1
    return HealthState(Health.EJECTED, 0, ejections, now + policy.wait(ejections))


def leg_failed(state: HealthState, policy: HealthPolicy, now: float) -> HealthState:
    """A leg failed on the worker (it could not be reached, or answered 5xx): ejected when
    that makes ``policy.failures`` in a row."""
    failed = state.failed + 1
    if state.health is Health.HEALTHY and failed >= policy.failures:
        return eject(state, policy, now)
    return attrs.evolve(state, failed=failed)


def leg_succeeded(state: HealthState) -> HealthState:
    """A leg succeeded on the worker: its failures in a row are forgotten."""
    if state.health is not Health.HEALTHY:
        return state  # an answer from before the ejection re-admits nothing
    fresh = HealthState(Health.HEALTHY)
    return state if state == fresh else fresh


def probe_failed(state: HealthState, policy: HealthPolicy, now: float) -> HealthState:
    """A probe failed: a healthy worker is ejected at once, an ejected one for longer."""
    if state.health is Health.STARTING:
        return state  # still starting: probed again, never routed to
    return eject(state, policy, now)


def readmit(state: HealthState, now: float) -> HealthState:
    """A probe passed, and the adapter has described the worker anew: it is routed to
    again, unless it is draining or its ejection has not run its time. Its ejections in
    a row are kept until a leg succeeds on it, so a worker that fails at once again
    waits longer."""
    if state.health is Health.DRAINING or not state.probe_due(now):
        return state
    return HealthState(Health.HEALTHY, 0, state.ejections)


def drain(state: HealthState) -> HealthState:
    """The worker is leaving: no new request goes to it."""
    return attrs.evolve(state, health=Health.DRAINING)

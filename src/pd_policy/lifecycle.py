"""A request's life through a router: explicit stages, the transitions between them, and when
a failed attempt may be retried.

The router drives it as h11 drives a connection: it reports each thing that happens
(a leg starts, the first byte goes to the client, a leg fails, the answer is done),
and the state says what is allowed next. A retry is safe and invisible only before the
client has seen anything: then the whole request is planned again, on other workers,
and the client never knows. After the first byte a failure is the stream's last event.

    PLANNING ─▶ RENDERING ─▶ ENCODING ─▶ PREFILLING ─▶ DECODING ─▶ RESPONDING ─▶ DONE
        ▲  (each leg may be skipped: n>1 has no prefill, P/D no encode)        │
        └──────────── retry: a retryable failure before the first byte ◀───────┘ (no)
                                        any failure otherwise ─▶ FAILED

[`fail`][pd_policy.lifecycle.fail] decides: a failure is retried when the error may
be retried (a worker's, never the policy's own refusal), the client has seen no byte,
and attempts are left; the worker it failed on is then excluded from the next attempt.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from .errors import MalformedRequest, PolicyError

__all__ = ["LifecycleError", "RequestLife", "Stage", "begin", "done", "fail", "responding"]


class Stage(enum.Enum):
    """Where a request is in its life."""

    PLANNING = "planning"
    RENDERING = "rendering"
    ENCODING = "encoding"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    #: The status line has gone to the client: nothing can be retried from here.
    RESPONDING = "responding"
    DONE = "done"
    FAILED = "failed"


#: The legs, in the order a request runs them (any may be skipped).
_LEGS: Final = (Stage.RENDERING, Stage.ENCODING, Stage.PREFILLING, Stage.DECODING)
_FINAL: Final = frozenset({Stage.DONE, Stage.FAILED})


class LifecycleError(RuntimeError):
    """The router reported an event its request's stage does not allow: a bug of the
    router's, never of the request's."""


@attrs.frozen(slots=True)
class RequestLife:
    """One request's life: its ``stage``, the ``attempt`` it is on (1 first), how many it
    may make in all, and the workers each failed attempt failed on (by name), which
    the next attempt leaves out."""

    stage: Stage = Stage.PLANNING
    attempt: int = 1
    attempts: int = attrs.field(default=2)
    failed_on: tuple[str, ...] = ()

    @attempts.validator
    def _check(self, _attr: attrs.Attribute[int], value: int) -> None:
        if type(value) is not int or value < 1:
            raise MalformedRequest("attempts must be a positive integer", param="attempts")

    @property
    def finished(self) -> bool:
        """Whether the request is done or failed."""
        return self.stage in _FINAL


def _at(life: RequestLife, stage: Stage) -> RequestLife:
    # The constructor, not attrs.evolve: a request makes five transitions, and evolve
    # reads the class's fields anew each time.
    return RequestLife(stage, life.attempt, life.attempts, life.failed_on)


def begin(life: RequestLife, leg: Stage) -> RequestLife:
    """The router starts ``leg`` (a render, encode, prefill or decode leg). Legs go in
    order, each at most once per attempt. Raises
    [`LifecycleError`][pd_policy.lifecycle.LifecycleError] otherwise."""
    if leg not in _LEGS:
        raise LifecycleError(f"{leg.value} is not a leg")
    current = _LEGS.index(life.stage) if life.stage in _LEGS else -1
    if life.stage is not Stage.PLANNING and (current < 0 or _LEGS.index(leg) <= current):
        raise LifecycleError(f"cannot start {leg.value} while {life.stage.value}")
    return _at(life, leg)


def responding(life: RequestLife) -> RequestLife:
    """The status line goes to the client: from the decoding stage only."""
    if life.stage is not Stage.DECODING:
        raise LifecycleError(f"cannot answer the client while {life.stage.value}")
    return _at(life, Stage.RESPONDING)


def done(life: RequestLife) -> RequestLife:
    """The client has its whole answer."""
    if life.stage is not Stage.RESPONDING:
        raise LifecycleError(f"cannot be done while {life.stage.value}")
    return _at(life, Stage.DONE)


def fail(life: RequestLife, error: PolicyError, worker: str | None = None) -> RequestLife:
    """A failure, on ``worker`` (its name) when a worker's leg failed.

    The answer is the next attempt, back in ``PLANNING`` with ``worker`` left out, when
    ``error`` may be retried, the client has seen nothing and an attempt is left;
    otherwise the request has ``FAILED`` (before the first byte the client gets
    ``error``; after it, the stream ends with it). Raises
    [`LifecycleError`][pd_policy.lifecycle.LifecycleError] for a request already
    finished.
    """
    if life.finished:
        raise LifecycleError(f"a {life.stage.value} request cannot fail")
    failed_on = life.failed_on + ((worker,) if worker is not None else ())
    unseen = life.stage is not Stage.RESPONDING
    if error.retryable and unseen and life.attempt < life.attempts:
        return RequestLife(Stage.PLANNING, life.attempt + 1, life.attempts, failed_on)
    return RequestLife(Stage.FAILED, life.attempt, life.attempts, failed_on)

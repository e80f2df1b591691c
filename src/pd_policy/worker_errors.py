"""Errors of a leg that failed on its worker: their status follows the worker's."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar, Final

from .errors import RETRYABLE_STATUSES, PolicyError

__all__ = ["WorkerFailedToStart", "WorkerStreamError", "grpc_status_to_http"]


#: gRPC status names (``grpc.StatusCode.X.name``) and the HTTP status a failed leg maps to.
_GRPC_TO_HTTP: Final[Mapping[str, int]] = MappingProxyType(
    {
        "INVALID_ARGUMENT": 400,
        "RESOURCE_EXHAUSTED": 429,
        "UNAVAILABLE": 503,
        "DEADLINE_EXCEEDED": 504,
        "INTERNAL": 500,
    }
)


def grpc_status_to_http(grpc_status: str) -> int:
    """Map a gRPC status name (e.g. ``"UNAVAILABLE"``) to the HTTP status of a failed leg.

    Statuses outside the table map to 500.
    """
    return _GRPC_TO_HTTP.get(grpc_status, 500)


class WorkerFailedToStart(PolicyError):
    """An encode, prefill or decode worker refused or failed a leg before its first output.

    Unlike the policy's own refusals, its status follows the worker's: its gRPC
    status (``grpc_status`` is the status name, e.g. ``"UNAVAILABLE"``), or, for
    a worker spoken to over HTTP, its HTTP status (``http_status``), and it may
    be retryable. ``leg`` is ``"encode"`` (E/P/D), ``"prefill"`` or ``"decode"``; ``detail`` is the
    worker's own message.
    """

    code = "worker_failed_to_start"
    status = 500
    meaning = "A worker failed to start a leg; the status is mapped from its gRPC status."

    #: The legs a worker can fail, in the catalog's order.
    LEGS: ClassVar[tuple[str, ...]] = ("prefill", "decode", "encode")
    _SUFFIX: ClassVar[str] = "worker_failed_to_start"
    _WHAT: ClassVar[str] = "worker failed to start"

    def __init__(
        self, leg: str, grpc_status: str = "", detail: str = "", *, http_status: int | None = None
    ) -> None:
        if leg not in self.LEGS:
            raise ValueError(f"leg must be one of {', '.join(map(repr, self.LEGS))}, not {leg!r}")
        self.leg = leg
        self.grpc_status = grpc_status
        self.detail = detail
        self.code = f"{leg}_{self._SUFFIX}"
        self.status = grpc_status_to_http(grpc_status) if http_status is None else http_status
        super().__init__(f"{leg.capitalize()} {self._WHAT}: {detail}".rstrip(": "))

    @property
    def retryable(self) -> bool:
        # A sidecar time-out repeats on retry, so it is marked non-retryable upstream.
        if self.grpc_status == "UNAVAILABLE" and "sidecar_timeout" in self.detail:
            return False
        return self.status in RETRYABLE_STATUSES


class WorkerStreamError(WorkerFailedToStart):
    """A worker's leg failed after it had started streaming."""

    _SUFFIX = "stream_error"
    _WHAT = "stream failed"

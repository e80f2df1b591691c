"""Policy errors on the wire: as a gRPC status with trailing metadata, and as HTTP.

A servicer or a gRPC-facing router aborts with [`grpc_status`][pd_policy_grpc.status.grpc_status]; a
client
turns the status it receives back into the typed error with
[`error_from_rpc`][pd_policy_grpc.status.error_from_rpc], so a policy error crosses a hop unchanged.

* 400 → ``INVALID_ARGUMENT``: the request cannot be served as sent;
* 502 (missing KV handoff) → ``FAILED_PRECONDITION``: the deployment must be
  fixed, and ``UNAVAILABLE`` would invite a retry;
* a worker's own failure → the worker's status, unchanged.

The trailing metadata carries the error code, the HTTP status and whether a
gateway may retry.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Final

import attrs

import grpc
from pd_policy import (
    ERROR_CATALOG,
    ERROR_CODE_HEADER,
    PolicyError,
    WorkerFailedToStart,
    WorkerStreamError,
)

__all__ = [
    "ERROR_CODE_METADATA",
    "HTTP_STATUS_METADATA",
    "RETRYABLE_METADATA",
    "GrpcStatus",
    "HttpError",
    "error_from_rpc",
    "grpc_status",
    "http_error",
]

#: Trailing-metadata key that carries the policy error code (gRPC keys are lower case).
ERROR_CODE_METADATA: Final = ERROR_CODE_HEADER.lower()
#: Trailing-metadata key that carries the HTTP status the error maps to.
HTTP_STATUS_METADATA: Final = "x-pd-http-status"
#: Trailing-metadata key that says whether a gateway may retry.
RETRYABLE_METADATA: Final = "x-pd-retryable"

_BY_HTTP: Final = {400: grpc.StatusCode.INVALID_ARGUMENT, 502: grpc.StatusCode.FAILED_PRECONDITION}


@attrs.frozen(slots=True)
class GrpcStatus:
    """A gRPC status for an error: code, details, and trailing metadata."""

    code: grpc.StatusCode
    details: str
    trailing_metadata: tuple[tuple[str, str], ...]


def grpc_status(error: PolicyError) -> GrpcStatus:
    """The gRPC status a servicer or router aborts with for ``error``."""
    details = error.message
    if isinstance(error, WorkerFailedToStart):
        code = grpc.StatusCode.__members__.get(error.grpc_status, grpc.StatusCode.UNKNOWN)
        details = error.detail  # the worker's own words; the receiver names the leg again
    else:
        code = _BY_HTTP.get(error.status, grpc.StatusCode.INTERNAL)
    metadata = (
        (ERROR_CODE_METADATA, error.code),
        (HTTP_STATUS_METADATA, str(error.status)),
        (RETRYABLE_METADATA, "true" if error.retryable else "false"),
    )
    return GrpcStatus(code, details, metadata)


def _metadata_value(metadata: Sequence[tuple[str, str | bytes]] | None, key: str) -> str | None:
    for k, v in metadata or ():
        if k == key:
            return v.decode() if isinstance(v, bytes) else v
    return None


def error_from_rpc(error: grpc.aio.AioRpcError, leg: str, *, started: bool = False) -> PolicyError:
    """The typed error for a failed call on ``leg`` (``"prefill"`` or ``"decode"``).

    A policy error that crossed the hop (its code in the trailing metadata)
    comes back as the same class and message; anything else is the worker's
    own failure, [`WorkerFailedToStart`][pd_policy.worker_errors.WorkerFailedToStart] or, once the
    leg had
    produced output, [`WorkerStreamError`][pd_policy.worker_errors.WorkerStreamError].
    """
    metadata = error.trailing_metadata()
    code = _metadata_value(metadata, ERROR_CODE_METADATA)  # type: ignore[arg-type]
    entry = ERROR_CATALOG.get(code or "")
    details = error.details() or ""
    if entry is None:
        cls = WorkerStreamError if started else WorkerFailedToStart
        return cls(leg, error.code().name, details)
    if issubclass(entry.error, WorkerFailedToStart):
        # A worker failure relayed by another hop keeps the leg it names.
        return entry.error(entry.code.split("_", 1)[0], error.code().name, details)
    return entry.error(details or None)


@attrs.frozen(slots=True)
class HttpError:
    """An error as an HTTP response: status, headers and the OpenAI-style JSON body."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def http_error(error: PolicyError) -> HttpError:
    """The HTTP response a gateway returns for ``error``."""
    headers = [("content-type", "application/json"), *error.headers().items()]
    body = json.dumps(error.to_body(), separators=(",", ":")).encode()
    return HttpError(error.status, tuple(headers), body)

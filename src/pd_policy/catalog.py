"""The error catalog: every code the policy can produce, with its status, retryability and
meaning. The single source of truth that the docs table (``docs/errors.md``) is
generated from."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import attrs

from .client_errors import (
    BodyTooLarge,
    ClientTooSlow,
    Overloaded,
    RequestTimedOut,
    RouterOwnedField,
    TooManyMediaItems,
    TooManyParts,
)
from .errors import (
    Forbidden,
    InvalidConfiguration,
    MalformedRequest,
    MediaRefsOnLanguageModelOnlyDecode,
    MissingEncoderOutput,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    MultimodalNotSupported,
    NoDecodeWorkerAvailable,
    NoWorkerAvailable,
    NSamplesOnLanguageModelOnlyDecode,
    PolicyError,
    Unauthorized,
)
from .kv_lease import KvLeaseExpired
from .media_errors import MediaFetchFailed, MediaRefused, MediaUnreachable, MissingMediaIdentity
from .wire_errors import LegRoutesDiffer, MediaOnBlindDecode
from .worker_errors import WorkerFailedToStart, WorkerStreamError

__all__ = ["ERROR_CATALOG", "CatalogEntry"]


@attrs.frozen(slots=True)
class CatalogEntry:
    """One row of [`ERROR_CATALOG`][pd_policy.catalog.ERROR_CATALOG]."""

    code: str
    #: The HTTP status, or ``None`` when it is mapped from the worker's gRPC status.
    status: int | None
    retryable: bool
    meaning: str
    error: type[PolicyError]


_POLICY_ERRORS: Final = (
    MropeOnLanguageModelOnlyDecode,
    MediaRefsOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    MediaOnBlindDecode,
    LegRoutesDiffer,
    MissingKvTransferParams,
    KvLeaseExpired,
    MissingEncoderOutput,
    MissingMediaIdentity,
    MultimodalNotSupported,
    MediaRefused,
    MediaFetchFailed,
    MediaUnreachable,
    MalformedRequest,
    RouterOwnedField,
    TooManyMediaItems,
    TooManyParts,
    BodyTooLarge,
    ClientTooSlow,
    Overloaded,
    RequestTimedOut,
    NoDecodeWorkerAvailable,
    Unauthorized,
    Forbidden,
    InvalidConfiguration,
)


def _build_catalog() -> Mapping[str, CatalogEntry]:
    rows: dict[str, CatalogEntry] = {
        cls.code: CatalogEntry(cls.code, cls.status, cls.may_retry, cls.meaning, cls)
        for cls in _POLICY_ERRORS
    }
    mapping = (
        "The status is mapped from its gRPC status (INVALID_ARGUMENT 400, RESOURCE_EXHAUSTED "
        "429, INTERNAL 500, UNAVAILABLE 503, DEADLINE_EXCEEDED 504, others 500), or is its "
        "HTTP status for a worker spoken to over HTTP; retryable under the default rules "
        "(408, 429, 5xx) except a sidecar time-out."
    )
    for leg in NoWorkerAvailable.LEGS:
        code = f"no_{leg}_worker_available"
        if code not in rows:  # the decode row is NoDecodeWorkerAvailable's
            rows[code] = CatalogEntry(code, 503, True, NoWorkerAvailable.meaning, NoWorkerAvailable)
    for leg in WorkerFailedToStart.LEGS:
        code = f"{leg}_worker_failed_to_start"
        what = f"The {leg} worker failed its leg before its first output. "
        rows[code] = CatalogEntry(code, None, True, what + mapping, WorkerFailedToStart)
    for leg in WorkerStreamError.LEGS:
        code = f"{leg}_stream_error"
        what = f"The {leg} worker's stream failed after it had started. "
        rows[code] = CatalogEntry(code, None, True, what + mapping, WorkerStreamError)
    return MappingProxyType(rows)


#: Every error code the policy can produce: code -> status, retryability and meaning.
ERROR_CATALOG: Final[Mapping[str, CatalogEntry]] = _build_catalog()

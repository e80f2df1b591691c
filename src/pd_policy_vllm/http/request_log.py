"""The proxy's one JSON line a request: its id, its route, its members, its form and its
outcome, on the ``pd_policy_vllm.http.requests`` logger.

A line names members by name and never carries a body, a header or a key. With
``--log-format json`` its fields are the line's own
([`log_format`][pd_policy_vllm.http.log_format]).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, Final

from pd_policy import Placement
from pd_policy_vllm.http.log_format import TRACE_ID

__all__ = ["log_request", "requests_log"]

#: One line a request: its id, its members, its form and its outcome (JSON).
requests_log: Final = logging.getLogger("pd_policy_vllm.http.requests")
_CLIENT_ID_CHARS: Final = 256


def log_request(
    request_id: str,
    route: str,
    placement: Placement[Any] | None,
    form: str | None,
    status: int,
    outcome: str,
    attempts: int,
    arrived: float,
    client_id: str | None = None,
) -> None:
    """Log the line of a request that arrived at ``arrived`` (``time.monotonic``), whose
    last attempt went to ``placement``: ``request_id`` is the proxy's (what the workers
    saw), ``client_id`` the client's ``X-Request-Id`` (its first 256 characters)."""
    encoder = placement.encoder if placement is not None else None
    line = {
        "request_id": request_id,
        "client_request_id": client_id[:_CLIENT_ID_CHARS] if client_id is not None else None,
        "route": route,
        "status": status,
        "outcome": outcome,
        "form": form,
        "attempts": attempts,
        "prefill": placement.prefill.name if placement else None,
        "decode": placement.decode.name if placement else None,
        "encoder": encoder.name if encoder is not None else None,
        "ms": round((time.monotonic() - arrived) * 1e3, 1),
        "trace_id": TRACE_ID.get(),  # the client's W3C trace, when it sent one
    }
    # The text format prints the JSON; the JSON format makes the fields its line's own.
    requests_log.info("%s", json.dumps(line, separators=(",", ":")), extra={"fields": line})

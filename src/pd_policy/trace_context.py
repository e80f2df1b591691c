"""W3C Trace Context, as a router passes a caller's on to its legs.

A router that starts no span of its own still keeps a request's trace whole: each leg
carries the caller's ``traceparent`` (and its ``tracestate``), so a worker that traces
(``vllm serve --otlp-traces-endpoint``) makes its span a child of the caller's. Only a
valid ``traceparent`` goes on (version ``00``, a trace id and a parent id not all
zeros), stripped, and a ``tracestate`` of printable ASCII within
[`MAX_TRACESTATE`][pd_policy.trace_context.MAX_TRACESTATE] beside it; nothing else of the
caller's. The same rule for every wire: HTTP headers, gRPC metadata.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

__all__ = ["MAX_TRACESTATE", "TRACEPARENT", "TRACESTATE", "passed_on", "trace_id_of"]

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
#: The longest ``tracestate`` passed on (W3C: 32 entries of at most 256 characters).
MAX_TRACESTATE: Final = 512

# Version "00", a trace id of 32 hex digits not all zero, a parent id of 16, flags of 2.
_TRACEPARENT: Final = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id of a W3C ``traceparent`` header, or ``None`` for none or a bad one."""
    found = _TRACEPARENT.match(traceparent.strip()) if traceparent else None
    if found is None or found.group(1) == "0" * 32 or found.group(2) == "0" * 16:
        return None
    return found.group(1)


def passed_on(headers: Mapping[str, str]) -> dict[str, str]:
    """What of a caller's ``headers`` (or metadata: lower-case names) a leg carries: its
    valid ``traceparent`` and the ``tracestate`` beside it; ``{}`` without a valid one."""
    parent = headers.get(TRACEPARENT)
    if parent is None or trace_id_of(parent) is None:
        return {}
    carrier = {TRACEPARENT: parent.strip()}
    state = headers.get(TRACESTATE)
    if state and len(state) <= MAX_TRACESTATE and state.isascii() and state.isprintable():
        carrier[TRACESTATE] = state
    return carrier

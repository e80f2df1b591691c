"""The client's trace context on the Ray decode server's legs.

Ray Serve LLM hands each call the client's headers (its ``RawRequestInfo``), and vLLM's
OpenAI serving reads a request's W3C trace context from them: a traced engine makes its
span a child of the ``traceparent`` it finds. The decode server starts no span of its
own (Ray's replicas trace, or not, by their own configuration), so both legs carry the
client's trace context, as the other routers pass one on
([`passed_on`][pd_policy.trace_context.passed_on]): only a valid ``traceparent`` and its
``tracestate``; an invalid one reaches no engine. The client's other headers go on as
Ray sends them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pd_policy.trace_context import TRACEPARENT, TRACESTATE, passed_on

__all__ = ["traced_info"]


def traced_info(info: Any) -> Any:
    """``info`` (Ray's ``RawRequestInfo`` of the client's request, or ``None``) as each leg
    gets it: its headers with the trace context checked (a new object; ``info`` is not
    changed)."""
    sent: Any = getattr(info, "headers", None)
    if not isinstance(sent, dict):
        return info
    headers = {k: v for k, v in sent.items() if k.lower() not in (TRACEPARENT, TRACESTATE)}
    headers.update(passed_on({k.lower(): v for k, v in sent.items()}))
    return dataclasses.replace(info, headers=headers)

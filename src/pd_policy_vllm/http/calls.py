"""Sending a leg to a worker: a POST whose every failure is typed, naming its leg.

A worker that cannot be reached is a 503 (another may be tried), one silent past the
read timeout a 504, one that breaks its answer (bad framing, over a cap, closed
mid-answer) a 502, and one that answers an error its own status with its own message.
A worker that refuses the router's own credentials is a 502: the client's are not in
question. No error names a worker's address: a URL may carry credentials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pd_policy import MalformedRequest, WorkerFailedToStart, WorkerStreamError
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.redact import Redactor
from pd_policy_vllm.http.upstream import Response, Upstream, UpstreamTimeout
from pd_policy_vllm.openai.wire.codec import loads
from pd_policy_vllm.openai.wire.splice import Spliced, written

__all__ = [
    "REQUEST_ID_HEADER",
    "failed_leg",
    "leg_headers",
    "parsed",
    "post_json",
    "unreachable",
    "worker_error",
]

#: The header vLLM takes a request's id from; every leg of a request carries the same.
REQUEST_ID_HEADER: Final = "X-Request-Id"
_JSON: Final = "application/json"
#: The characters of a worker's error body that is not JSON relayed at most.
_RAW_DETAIL: Final = 500


async def worker_error(leg: str, response: Response, redactor: Redactor) -> WorkerFailedToStart:
    """The error of a leg whose worker answered ``response``, an error: its own message
    (or the start of its body), every key of ``redactor`` redacted."""
    if response.status in (401, 403):
        # The router's own credentials were refused: the client's are not in question,
        # so it is told of a bad gateway, not that it is unauthorized.
        return WorkerFailedToStart(
            leg,
            detail=f"the worker refused the router's credentials ({response.status})",
            http_status=502,
        )
    # The worker's own message (vLLM's OpenAI error body), without its request body.
    raw = await response.read()
    try:
        detail = redactor.text(str(loads(raw, what="the worker's error")["error"]["message"]))
    except Exception:
        # Redacted before it is cut: a key across the cut would leave its start behind.
        start = raw[: _RAW_DETAIL + 4 * redactor.longest_text].decode("utf-8", "replace")
        detail = redactor.text(start)[:_RAW_DETAIL]
    return WorkerFailedToStart(leg, detail=detail, http_status=response.status)


def leg_headers(request_id: str, workers: Mapping[str, str] | None = None) -> dict[str, str]:
    """The headers of every leg of request ``request_id``: its id (vLLM takes it from
    there), JSON, and ``workers``' (the workers' key). A worker URL with credentials of
    its own is called with those instead of the key (the legs' client sees to it)."""
    return {REQUEST_ID_HEADER: request_id, "Content-Type": _JSON, **(workers or {})}


def unreachable(leg: str, exc: BaseException) -> WorkerFailedToStart:
    """A leg whose worker could not be reached: a 503 naming the kind of failure, never
    the worker's address (a URL may carry credentials)."""
    return WorkerFailedToStart(
        leg, detail=f"the worker could not be reached ({type(exc).__name__})", http_status=503
    )


def failed_leg(leg: str, exc: aiohttp.ClientError) -> WorkerFailedToStart:
    """The error of a leg whose call to its worker raised ``exc``: a 504 for a worker
    silent past the read timeout, a 502 for one that broke its answer (bad framing,
    over a cap, closed mid-answer), and a 503 for one that could not be reached."""
    if isinstance(exc, UpstreamTimeout):
        return WorkerFailedToStart(leg, detail=str(exc), http_status=504)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return WorkerFailedToStart(
            leg, detail=f"the worker's answer failed ({exc})", http_status=502
        )
    return unreachable(leg, exc)


async def post_json(
    upstream: Upstream,
    leg: str,
    url: str,
    body: Any,
    headers: Mapping[str, str],
    *,
    parse: bool = True,
) -> Any:
    """POST ``body`` with ``headers`` (the leg's, [`leg_headers`][
    pd_policy_vllm.http.calls.leg_headers]; ``bytes`` are sent as they are,
    a [`Spliced`][pd_policy_vllm.openai.wire.splice.Spliced] body part by part, anything else is
    written as JSON) and return the JSON answer, or its bytes unparsed when not
    ``parse``.
    Raises ``WorkerFailedToStart`` for a worker that cannot be reached (503) or answers
    with an error (its status), and a ``WorkerStreamError`` (502) for a 200 that is not
    JSON (when parsed)."""
    try:
        data: bytes | list[bytes | memoryview]
        if not isinstance(body, bytes | Spliced):
            body = written(body)  # a long data URL a view of its bytes, not copied again
        data = body.chunks() if isinstance(body, Spliced) else body
        async with upstream.post(url, data, headers) as r:
            if r.status != 200:
                raise await worker_error(leg, r, upstream.redactor)
            raw = await r.read()
    except aiohttp.ClientError as exc:
        raise failed_leg(leg, exc) from exc
    return parsed(raw, leg, f"the {leg} response") if parse else raw


def parsed(raw: bytes, leg: str, what: str) -> Any:
    # A worker's answer that is not JSON is the worker's fault: a 502, not the client's 400.
    try:
        return loads(raw, what=what)
    except MalformedRequest as exc:
        raise WorkerStreamError(leg, detail=exc.message, http_status=502) from None

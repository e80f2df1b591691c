"""Sending a leg to a worker, and relaying the decode's answer to the client.

The decode's answer goes back as the worker sent it: a JSON body byte for
byte, or its server-sent events chunk by chunk. A leg whose output is tokens
(the metadata path, [`scale_out`][pd_policy_vllm.http.scale_out]) is derendered on
the decode server first, whole or one event at a time.

A client that disconnects cancels the handler; leaving the request's block
closes the upstream connection, and vLLM aborts a request whose client is gone.
After the status line has gone out, a failure is the stream's last event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import attrs

from pd_policy import MalformedRequest, PolicyError, WorkerFailedToStart, WorkerStreamError

from .aio import aiohttp, web
from .auth import for_url
from .codec import dumps, loads
from .legs import Leg
from .scale_out import Derender
from .splice import Spliced
from .upstream import Response, Upstream, UpstreamTimeout

__all__ = [
    "REQUEST_ID_HEADER", "Relayed", "error_response", "failed_leg", "post_json", "relay_decode",
    "unreachable",
]  # fmt: skip

#: The header vLLM takes a request's id from; every leg of a request carries the same.
REQUEST_ID_HEADER: Final = "X-Request-Id"
_JSON: Final = "application/json"
_EVENTS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def error_response(error: PolicyError) -> web.Response:
    """The OpenAI error body of ``error``, with its status and error-code header."""
    return web.json_response(error.to_body(), status=error.status, headers=error.headers())


async def _worker_error(leg: str, response: Response) -> WorkerFailedToStart:
    if response.status in (401, 403):
        # The router's own credentials were refused: the client's are not in question,
        # so it is told of a bad gateway, not that it is unauthorized.
        return WorkerFailedToStart(leg, detail=f"the worker refused the router's credentials "
                                   f"({response.status})", http_status=502)  # fmt: skip
    # The worker's own message (vLLM's OpenAI error body), without its request body.
    raw = await response.read()
    try:
        detail = str(loads(raw, what="the worker's error")["error"]["message"])
    except Exception:
        detail = raw[:500].decode("utf-8", "replace")
    return WorkerFailedToStart(leg, detail=detail, http_status=response.status)


def _headers(request_id: str, extra: Mapping[str, str] | None, url: str) -> dict[str, str]:
    return {REQUEST_ID_HEADER: request_id, "Content-Type": _JSON, **for_url(extra, url)}


def unreachable(leg: str, exc: BaseException) -> WorkerFailedToStart:
    """A leg whose worker could not be reached: a 503 naming the kind of failure, never
    the worker's address (a URL may carry credentials)."""
    return WorkerFailedToStart(leg, detail=f"the worker could not be reached "
                               f"({type(exc).__name__})", http_status=503)  # fmt: skip


def failed_leg(leg: str, exc: aiohttp.ClientError) -> WorkerFailedToStart:
    """The error of a leg whose call to its worker raised ``exc``: a 504 for a worker
    silent past the read timeout, a 502 for one that broke its answer (bad framing,
    over a cap, closed mid-answer), and a 503 for one that could not be reached."""
    if isinstance(exc, UpstreamTimeout):
        return WorkerFailedToStart(leg, detail=str(exc), http_status=504)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return WorkerFailedToStart(leg, detail=f"the worker's answer failed ({exc})",
                                   http_status=502)  # fmt: skip
    return unreachable(leg, exc)


async def post_json(
    upstream: Upstream,
    leg: str,
    url: str,
    body: Any,
    request_id: str,
    headers: Mapping[str, str] | None = None,
    *,
    parse: bool = True,
) -> Any:
    """POST ``body`` (with ``headers``: the workers' key; ``bytes`` are sent as they are,
    a [`Spliced`][pd_policy_vllm.http.splice.Spliced] body part by part, anything else is
    written as JSON) and return the JSON answer, or its bytes unparsed when not
    ``parse``.
    Raises ``WorkerFailedToStart`` for a worker that cannot be reached (503) or answers
    with an error (its status), and a ``WorkerStreamError`` (502) for a 200 that is not
    JSON (when parsed)."""
    try:
        sent = _headers(request_id, headers, url)
        data: bytes | list[bytes | memoryview]
        if isinstance(body, Spliced):
            data = body.chunks()
        else:
            data = body if isinstance(body, bytes) else dumps(body)
        async with await upstream.post(url, data, sent) as r:
            if r.status != 200:
                raise await _worker_error(leg, r)
            raw = await r.read()
    except aiohttp.ClientError as exc:
        raise failed_leg(leg, exc) from exc
    return _json(raw, leg, f"the {leg} response") if parse else raw


def _json(raw: bytes, leg: str, what: str) -> Any:
    # A worker's answer that is not JSON is the worker's fault: a 502, not the client's 400.
    try:
        return loads(raw, what=what)
    except MalformedRequest as exc:
        raise WorkerStreamError(leg, detail=exc.message, http_status=502) from None


async def _events(response: Response) -> AsyncIterator[bytes]:
    # One server-sent event's data per item; vLLM sends one "data: ..." line per event.
    rest = b""
    async for piece in response:
        *lines, rest = (rest + piece).split(b"\n")
        for line in lines:
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()
    line = rest.strip()
    if line.startswith(b"data:"):
        yield line[5:].strip()


async def _derendered(
    upstream: Upstream,
    url: str,
    derender: Derender,
    up: Response,
    request_id: str,
    headers: Mapping[str, str] | None,
) -> AsyncIterator[bytes]:
    state = None
    first = True
    async for data in _events(up):
        if data == b"[DONE]":
            break
        chunk = _json(data, "decode", "a decode event")
        answer = await post_json(
            upstream, "decode", url + derender.route, derender.chunk(chunk, state), request_id,
            headers,
        )  # fmt: skip
        if not isinstance(answer, dict) or "chunk" not in answer:
            raise WorkerStreamError("decode", detail="the derender gave no chunk", http_status=502)
        state = answer.get("stream_state")
        yield dumps(derender.with_prompt_ids(answer["chunk"]) if first else answer["chunk"])
        first = False
    yield b"[DONE]"


@attrs.define
class Relayed:
    """What relaying a decode did: the client's response; the failure that ended its
    stream after the status line had gone out (too late for a retry), if any; when the
    first byte went to the client; and the bytes of the decode leg sent."""

    response: web.StreamResponse
    late_error: PolicyError | None
    first_byte: float
    sent: int


async def relay_decode(
    request: web.Request,
    upstream: Upstream,
    url: str,
    leg: Leg,
    request_id: str,
    *,
    stream: bool,
    headers: Mapping[str, str] | None = None,
) -> Relayed:
    """Send the decode ``leg`` to the worker at ``url`` (with ``headers``: the workers'
    key) and answer the client ``request`` with what it returns, as an event stream when
    ``stream``.

    Raises the leg's failure (``WorkerFailedToStart``, ``WorkerStreamError``, a policy
    error of the derender) when it comes before any byte went to the client, so that
    the request may be tried again; after that, the failure is the stream's last event
    and [`Relayed.late_error`][pd_policy_vllm.http.relay.Relayed]."""
    out: web.StreamResponse | None = None
    data = dumps(leg.body)
    try:
        async with await upstream.post(
            url + leg.route, data, _headers(request_id, headers, url)
        ) as up:
            if up.status != 200:
                raise await _worker_error("decode", up)
            if not stream:
                raw = await up.read()
                if leg.derender is not None:
                    whole = leg.derender.whole(_json(raw, "decode", "the decode response"))
                    answer = await post_json(
                        upstream, "decode", url + leg.derender.route, whole, request_id, headers
                    )
                    raw = dumps(leg.derender.with_prompt_ids(answer))
                # The worker's answer is the client's, byte for byte: no parse, no dump.
                return Relayed(web.Response(body=raw, content_type=_JSON), None,
                               time.monotonic(), len(data))  # fmt: skip
            out = web.StreamResponse(headers=_EVENTS)
            await out.prepare(request)
            first = time.monotonic()
            if leg.derender is None:
                async for piece in up:
                    await out.write(piece)
            else:
                events = _derendered(upstream, url, leg.derender, up, request_id, headers)
                async for event in events:
                    await out.write(b"data: " + event + b"\n\n")
    except (aiohttp.ClientError, PolicyError) as exc:
        error = (
            exc
            if isinstance(exc, PolicyError)
            else WorkerStreamError("decode", detail=type(exc).__name__,
                                   http_status=504 if isinstance(exc, UpstreamTimeout) else 502)
        )  # fmt: skip
        if out is None:
            if isinstance(exc, aiohttp.ClientError) and not isinstance(
                exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError
            ):  # fmt: skip
                raise failed_leg("decode", exc) from exc
            raise error from exc
        await out.write(b"data: " + dumps(error.to_body()) + b"\n\ndata: [DONE]\n\n")
        await out.write_eof()
        return Relayed(out, error, first, len(data))
    await out.write_eof()
    return Relayed(out, None, first, len(data))

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

from collections.abc import AsyncIterator
from typing import Any, Final

from pd_policy import MalformedRequest, PolicyError, WorkerFailedToStart, WorkerStreamError

from .aio import aiohttp, web
from .codec import dumps, loads
from .legs import Leg
from .scale_out import Derender

__all__ = ["REQUEST_ID_HEADER", "error_response", "post_json", "relay_decode"]

#: The header vLLM takes a request's id from; every leg of a request carries the same.
REQUEST_ID_HEADER: Final = "X-Request-Id"
_JSON: Final = "application/json"
_EVENTS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def error_response(error: PolicyError) -> web.Response:
    """The OpenAI error body of ``error``, with its status and error-code header."""
    return web.json_response(error.to_body(), status=error.status, headers=error.headers())


async def _worker_error(leg: str, response: aiohttp.ClientResponse) -> WorkerFailedToStart:
    # The worker's own message (vLLM's OpenAI error body), without its request body.
    try:
        detail = str((await response.json())["error"]["message"])
    except Exception:
        detail = (await response.text())[:500]
    return WorkerFailedToStart(leg, detail=detail, http_status=response.status)


def _headers(request_id: str) -> dict[str, str]:
    return {REQUEST_ID_HEADER: request_id, "Content-Type": _JSON}


async def post_json(
    session: aiohttp.ClientSession, leg: str, url: str, body: Any, request_id: str
) -> Any:
    """POST ``body`` and return the JSON answer. Raises ``WorkerFailedToStart`` for a
    worker that cannot be reached (503) or answers with an error (its status), and a
    ``WorkerStreamError`` (502) for a 200 that is not JSON."""
    try:
        async with session.post(url, data=dumps(body), headers=_headers(request_id)) as response:
            if response.status != 200:
                raise await _worker_error(leg, response)
            raw = await response.read()
    except aiohttp.ClientError as exc:
        raise WorkerFailedToStart(leg, detail=str(exc), http_status=503) from exc
    return _json(raw, leg, f"the {leg} response")


def _json(raw: bytes, leg: str, what: str) -> Any:
    # A worker's answer that is not JSON is the worker's fault: a 502, not the client's 400.
    try:
        return loads(raw, what=what)
    except MalformedRequest as exc:
        raise WorkerStreamError(leg, detail=exc.message, http_status=502) from None


async def _events(response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    # One server-sent event's data per item; vLLM sends one "data: ..." line per event.
    async for line in response.content:
        line = line.strip()
        if line.startswith(b"data:"):
            yield line[5:].strip()


async def _derendered(
    session: aiohttp.ClientSession,
    url: str,
    derender: Derender,
    up: aiohttp.ClientResponse,
    request_id: str,
) -> AsyncIterator[bytes]:
    state = None
    first = True
    async for data in _events(up):
        if data == b"[DONE]":
            break
        chunk = _json(data, "decode", "a decode event")
        answer = await post_json(
            session, "decode", url + derender.route, derender.chunk(chunk, state), request_id
        )
        if not isinstance(answer, dict) or "chunk" not in answer:
            raise WorkerStreamError("decode", detail="the derender gave no chunk", http_status=502)
        state = answer.get("stream_state")
        yield dumps(derender.with_prompt_ids(answer["chunk"]) if first else answer["chunk"])
        first = False
    yield b"[DONE]"


async def relay_decode(
    request: web.Request,
    session: aiohttp.ClientSession,
    url: str,
    leg: Leg,
    request_id: str,
    *,
    stream: bool,
) -> web.StreamResponse:
    """Send the decode ``leg`` to the worker at ``url`` and answer the client ``request``
    with what it returns, as an event stream when ``stream``."""
    out: web.StreamResponse | None = None
    try:
        async with session.post(
            url + leg.route, data=dumps(leg.body), headers=_headers(request_id)
        ) as up:
            if up.status != 200:
                return error_response(await _worker_error("decode", up))
            if not stream:
                raw = await up.read()
                if leg.derender is not None:
                    whole = leg.derender.whole(_json(raw, "decode", "the decode response"))
                    answer = await post_json(
                        session, "decode", url + leg.derender.route, whole, request_id
                    )
                    answer = leg.derender.with_prompt_ids(answer)
                    return web.Response(body=dumps(answer), content_type=_JSON)
                # The worker's answer is the client's, byte for byte: no parse, no dump.
                return web.Response(body=raw, content_type=_JSON)
            out = web.StreamResponse(headers=_EVENTS)
            await out.prepare(request)
            if leg.derender is None:
                async for piece in up.content.iter_any():
                    await out.write(piece)
            else:
                async for data in _derendered(session, url, leg.derender, up, request_id):
                    await out.write(b"data: " + data + b"\n\n")
    except (aiohttp.ClientError, PolicyError) as exc:
        error = (
            exc
            if isinstance(exc, PolicyError)
            else WorkerStreamError("decode", detail=str(exc), http_status=502)
        )
        if out is None:
            return error_response(error)
        await out.write(b"data: " + dumps(error.to_body()) + b"\n\ndata: [DONE]\n\n")
    assert out is not None
    await out.write_eof()
    return out

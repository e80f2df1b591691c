"""Relaying the decode's answer to the client.

The decode's answer goes back as the worker sent it: a JSON body byte for
byte, or its server-sent events chunk by chunk, but for the proxy's keys, redacted
([`redact`][pd_policy_vllm.http.redact]), as is any error the stream ends with. A leg
whose output is tokens (the metadata path,
[`scale_out`][pd_policy_vllm.openai.plan.scale_out]) is derendered on the decode server
first, whole or one event at a time.

A stream's status line waits for the decode's first event that says whether the leg
started ([`stream_head`][pd_policy_vllm.http.stream_head]): a leg that failed before its
first output (a KV load that failed) is a typed error, never a 200. A client that
disconnects cancels the handler; leaving the request's block closes the upstream
connection, and vLLM aborts a request whose client is gone. After the status line has
gone out, a failure is the stream's last event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Final

from pd_policy import PolicyError, WorkerStreamError
from pd_policy_vllm.http.aio import aiohttp, web
from pd_policy_vllm.http.calls import (
    REQUEST_ID_HEADER,
    failed_leg,
    parsed,
    post_json,
    worker_error,
)
from pd_policy_vllm.http.redact import Redactor
from pd_policy_vllm.http.stream_head import HELD, decisive, event_data, stream_failure
from pd_policy_vllm.http.upstream import Response, Upstream, UpstreamTimeout
from pd_policy_vllm.openai.plan.legs import Leg
from pd_policy_vllm.openai.plan.scale_out import Derender
from pd_policy_vllm.openai.wire.codec import dumps
from pd_policy_vllm.openai.wire.splice import Spliced, written

__all__ = ["DecodeRelay"]

_JSON: Final = "application/json"
_EVENTS: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


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
    headers: Mapping[str, str],
) -> AsyncIterator[bytes]:
    state = None
    first = True
    async for data in _events(up):
        if data == b"[DONE]":
            break
        if first and (failure := stream_failure(data, upstream.redactor)) is not None:
            raise failure  # the leg failed before its first output
        chunk = parsed(data, "decode", "a decode event")
        call = derender.chunk(chunk, state)
        answer = await post_json(upstream, "decode", url + derender.route, call, headers)
        if not isinstance(answer, dict) or "chunk" not in answer:
            raise WorkerStreamError("decode", detail="the derender gave no chunk", http_status=502)
        state = answer.get("stream_state")
        yield dumps(derender.with_prompt_ids(answer["chunk"]) if first else answer["chunk"])
        first = False
    yield b"[DONE]"


class DecodeRelay:
    """Relaying one decode leg to the client ``request``: the response it answers with, when
    its first byte went out, and the bytes of the leg sent.

    ``first_byte`` is called as the status line goes out (a streamed answer): from then on
    a failure can only end the stream. A whole answer goes out when the handler returns it,
    with nothing left to fail. What goes out is redacted by ``redactor``; a stream's head
    carries ``request_id`` (the id the client's answer echoes).
    """

    def __init__(
        self,
        request: web.Request,
        first_byte: Callable[[], object],
        redactor: Redactor,
        request_id: str,
    ) -> None:
        self._request, self._first_byte = request, first_byte
        self._redactor, self._request_id = redactor, request_id
        self.response: web.StreamResponse | None = None
        self.first_byte_at = 0.0
        #: When a stream's first body byte went to the client (its time to first token);
        #: 0 for a whole answer, or a stream that sent none.
        self.first_content_at = 0.0
        self.sent = 0
        self._streaming = False

    async def run(
        self,
        upstream: Upstream,
        url: str,
        leg: Leg,
        headers: Mapping[str, str],
        *,
        stream: bool,
    ) -> PolicyError | None:
        """Send the decode ``leg`` to the worker at ``url`` (with ``headers``: the legs',
        [`leg_headers`][pd_policy_vllm.http.calls.leg_headers]) and answer the client with
        what it returns, as an event stream when ``stream``. Returns ``None`` when the
        answer is whole, and the failure that ended the stream after its first byte, as
        its last event.

        Raises the leg's failure (``WorkerFailedToStart``, ``WorkerStreamError``, a policy
        error of the derender) when it comes before any byte went to the client, so that
        the request may be tried again."""
        body = written(leg.body)  # a long data URL a view of its bytes, not copied again
        data = body.chunks() if isinstance(body, Spliced) else body
        self.sent = body.size if isinstance(body, Spliced) else len(body)
        try:
            async with upstream.post(url + leg.route, data, headers) as up:
                if up.status != 200:
                    raise await worker_error("decode", up, self._redactor)
                if not stream:
                    raw = await up.read()
                    if leg.derender is not None:
                        whole = leg.derender.whole(parsed(raw, "decode", "the decode response"))
                        route = url + leg.derender.route
                        answer = await post_json(upstream, "decode", route, whole, headers)
                        raw = dumps(leg.derender.with_prompt_ids(answer))
                    # The worker's answer is the client's, byte for byte (no parse, no
                    # dump), but for a key.
                    body = self._redactor.data(raw)
                    self.response = web.Response(body=body, content_type=_JSON)
                    self.first_byte_at = time.monotonic()
                    return None
                if leg.derender is None:
                    # The head waits for the stream's first decisive event (stream_head).
                    held = await self._held(up)
                    out = await self._begin()
                    redacting = self._redactor.stream()
                    if sent := redacting.piece(held):
                        await out.write(sent)
                        self.first_content_at = time.monotonic()
                    async for piece in up:
                        if sent := redacting.piece(piece):
                            await out.write(sent)
                            self.first_content_at = self.first_content_at or time.monotonic()
                    if rest := redacting.end():
                        await out.write(rest)
                else:
                    events = _derendered(upstream, url, leg.derender, up, headers)
                    first = await anext(events)  # a failure before it: no head went out
                    out = await self._begin()
                    await out.write(b"data: " + self._redactor.data(first) + b"\n\n")
                    self.first_content_at = time.monotonic()
                    async for event in events:
                        await out.write(b"data: " + self._redactor.data(event) + b"\n\n")
        except (aiohttp.ClientError, PolicyError) as exc:
            if not self._streaming:
                if isinstance(exc, PolicyError):
                    raise
                if not isinstance(
                    exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError
                ):
                    raise failed_leg("decode", exc) from exc
                raise _broke(exc) from exc
            error = exc if isinstance(exc, PolicyError) else _broke(exc)
            await self.end(error)
            return error
        await self.end(None)
        return None

    async def _held(self, up: Response) -> bytes:
        # What the decode streamed up to its first decisive event (or HELD bytes, or its
        # end), none of it sent yet; raises the failure that event reports.
        held = b""
        while len(held) <= HELD:
            try:
                held += await anext(up)
            except StopAsyncIteration:
                break
            for data in event_data(held):
                if decisive(data):
                    failure = stream_failure(data, self._redactor)
                    if failure is not None:
                        raise failure
                    return held
        return held

    async def _begin(self) -> web.StreamResponse:
        # The stream's head goes out: from now on a failure can only end the stream.
        head = {**_EVENTS, REQUEST_ID_HEADER: self._request_id}
        out = self.response = web.StreamResponse(headers=head)
        await out.prepare(self._request)
        self._streaming, self.first_byte_at = True, time.monotonic()
        self._first_byte()
        return out

    async def end(self, error: PolicyError | None) -> None:
        """End a stream that has begun: with ``error`` as its last event, when given."""
        out = self.response
        if not self._streaming or out is None:
            return
        self._streaming = False
        if error is not None:
            body = dumps(self._redactor.error_body(error))
            await out.write(b"data: " + body + b"\n\ndata: [DONE]\n\n")
        await out.write_eof()


def _broke(exc: aiohttp.ClientError) -> WorkerStreamError:
    status = 504 if isinstance(exc, UpstreamTimeout) else 502
    return WorkerStreamError("decode", detail=type(exc).__name__, http_status=status)

"""No key the proxy knows leaves in what it relays from a worker: a stand-in worker that
quotes the ``Authorization`` header it received (the workers' key), and the clients' and
admins' keys besides, in its error messages and its answers, on every leg it serves: a
P/D prefill and decode, the M-RoPE metadata path's render, prefill, decode and derender,
E/P/D's encoder, and ``/v1/models``. The client still gets the worker's message, with
each key replaced by ``<redacted>``."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp
import attrs
import pytest
from aiohttp import web
from fleet_stands import serving
from test_http_epd import answer as encoder_answer
from test_http_scale_out import METADATA, prefill_answer, render_response

from pd_policy import EncoderCacheRole, KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.plan.scale_out import DERENDER, GENERATE, RENDER

WORKER_KEY: Final = "wk-7f3a9c2e-the-workers-key"
CLIENT_KEY: Final = "ck-4b1d0e7a-a-clients-key"
ADMIN_KEY: Final = "ak-9e8d6c5b-an-admins-key"
KEYS: Final = Keys(WORKER_KEY, (CLIENT_KEY,), (ADMIN_KEY,))
CHAT: Final = "/v1/chat/completions"
TEXT: Final = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
IMAGE: Final = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
PICTURE: Final = {"model": "m", "max_tokens": 4, "temperature": 0, "messages": [
    {"role": "user", "content": [IMAGE, {"type": "text", "text": "what is it?"}]}]}  # fmt: skip


def leaked(answer: bytes) -> list[str]:
    """Every key any 8 characters of which are in ``answer``: a key cut short leaks too."""
    return [
        key
        for key in (WORKER_KEY, CLIENT_KEY, ADMIN_KEY)
        if any(key[i : i + 8].encode() in answer for i in range(len(key) - 7))
    ]


def quoting(request: web.Request) -> str:
    """What a careless worker says: the header it got, and the other keys it knows."""
    return (
        f"refused: Authorization: {request.headers.get('Authorization')} "
        f"(not {CLIENT_KEY}, nor {ADMIN_KEY})"
    )


@attrs.define
class Echo:
    """A stand-in worker in the role ``role`` that serves every route: one named in ``fail``
    answers with that status and an OpenAI error quoting the keys (a body that is not JSON
    when ``raw``); one named in ``answers`` answers that 200 JSON; ``pieces`` are written
    as a streamed answer (but a derender's), one write each."""

    role: str
    fail: dict[str, int] = attrs.field(factory=dict)
    raw: bool = False
    answers: dict[str, Any] = attrs.field(factory=dict)
    pieces: list[bytes] = attrs.field(factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        for route in (CHAT, RENDER, GENERATE, DERENDER):
            app.router.add_post(route, self.serve)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": quoting(request)}]})

    async def serve(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        route = request.path
        if route in self.fail:
            status = self.fail[route]
            if self.raw:  # a proxy's page: the key straddles the 500 bytes relayed
                page = "x" * (500 - 40) + quoting(request)
                return web.Response(text=page, status=status, content_type="text/html")
            error = {"error": {"message": quoting(request), "type": "bad", "code": status}}
            return web.json_response(error, status=status)
        if route in self.answers:
            return web.json_response(self.answers[route])
        if body.get("stream") and self.pieces and route != DERENDER:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for piece in self.pieces:
                await response.write(piece)
                await asyncio.sleep(0.05)  # each piece its own chunk at the proxy
            return response
        return web.json_response(self._answer(route, body))

    def _answer(self, route: str, body: dict[str, Any]) -> Any:
        render = render_response(stream=bool(body.get("stream")))  # as rendered: its stream
        if route == RENDER:
            return render
        if route == DERENDER:
            message = {"message": {"role": "assistant", "content": "ok"}}
            if body.get("stream"):
                return {"chunk": {"choices": [{"delta": {"content": "ok"}}]}, "stream_state": 1}
            return {"choices": [message], "prompt_token_ids": None}
        if self.role == "encode":
            return encoder_answer(render, metadata=True)
        if self.role == "prefill":
            if route == GENERATE:
                return prefill_answer(render)
            params = {"do_remote_prefill": True, "transfer_id": "t"}
            return {"prompt_token_ids": [1, 2, 3], "kv_transfer_params": params}
        if route == GENERATE:
            return {"choices": [{"token_ids": [5]}]}
        return {"choices": [{"message": {"content": "ok"}}]}


@contextlib.asynccontextmanager
async def behind_proxy(
    prefill: Echo, decode: Echo, encoder: Echo | None = None, *, metadata: bool = False
) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    """The stand-ins behind a proxy that calls them with the workers' key and takes the
    clients'; a session that presents a client's key, and the proxy's URL. ``metadata``:
    an M-RoPE model whose decode takes metadata (the render path)."""
    async with contextlib.AsyncExitStack() as stack:
        urls = [await stack.enter_async_context(serving(s.app())) for s in (prefill, decode)]
        kv = PrefillKv(KvConnectorMode.TRANSFER)
        vision = WorkerCapability(Support.TRUE, encoder_cache=EncoderCacheRole.CONSUMER)
        decoding = METADATA if metadata else WorkerCapability(Support.FALSE)
        encoding = None
        if encoder is not None:
            at = await stack.enter_async_context(serving(encoder.app()))
            producer = WorkerCapability(Support.TRUE, encoder_cache=EncoderCacheRole.PRODUCER)
            encoding = HttpWorker(at, producer, renders=True)
        proxy = Proxy(
            HttpWorker(urls[0], vision, kv=kv, renders=metadata),
            [HttpWorker(urls[1], decoding, renders=metadata)],
            encoder=encoding, mrope=metadata, keys=KEYS, log_requests=False,
        )  # fmt: skip
        url = await stack.enter_async_context(serving(proxy.app()))
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        session = await stack.enter_async_context(aiohttp.ClientSession(headers=headers))
        yield session, url


def ask(prefill: Echo, decode: Echo, body: Any, **kw: Any) -> tuple[int, bytes]:
    """The proxy's status and answer, its headers first, to ``body``."""

    async def go() -> tuple[int, bytes]:
        async with (
            behind_proxy(prefill, decode, **kw) as (session, url),
            session.post(url + CHAT, json=body) as answer,
        ):
            head = "".join(f"{k}: {v}\n" for k, v in answer.headers.items())
            return answer.status, head.encode() + b"\n" + await answer.read()

    return asyncio.run(go())


def body_of(answer: bytes) -> Any:
    return json.loads(answer.partition(b"\n\n")[2])


def check(status: int, answer: bytes, expected: int) -> None:
    assert leaked(answer) == [], answer
    assert status == expected, answer
    # The worker's own words, redacted (the mark itself may be cut at the 500 characters).
    assert b"<redact" in answer, answer


@pytest.mark.parametrize("status", [400, 500])
def test_a_prefill_that_quotes_the_keys_in_its_error(status: int) -> None:
    check(*ask(Echo("prefill", fail={CHAT: status}), Echo("decode"), TEXT), status)


def test_a_prefill_error_page_cut_at_500_bytes_holds_no_key_cut_short() -> None:
    check(*ask(Echo("prefill", fail={CHAT: 503}, raw=True), Echo("decode"), TEXT), 503)


def test_a_decode_that_quotes_the_keys_in_its_error() -> None:
    check(*ask(Echo("prefill"), Echo("decode", fail={CHAT: 400}), TEXT), 400)


def test_a_decode_answer_that_quotes_a_key_is_relayed_redacted() -> None:
    said = {"choices": [{"message": {"content": f"the key is {WORKER_KEY}"}}]}
    status, answer = ask(Echo("prefill"), Echo("decode", answers={CHAT: said}), TEXT)
    check(status, answer, 200)
    assert body_of(answer)["choices"][0]["message"]["content"] == "the key is <redacted>"


def test_a_streamed_key_split_across_chunks_and_a_stream_error_event_are_redacted() -> None:
    cut = 9
    pieces = [
        b'data: {"choices": [{"delta": {"content": "Bearer ' + WORKER_KEY[:cut].encode(),
        WORKER_KEY[cut:].encode() + b'"}}]}\n\n',
        b'data: {"error": {"message": "' + CLIENT_KEY.encode() + b'", "code": 500}}\n\n',
        b"data: [DONE]\n\n",
    ]
    body = {**TEXT, "stream": True}
    status, answer = ask(Echo("prefill"), Echo("decode", pieces=pieces), body)
    check(status, answer, 200)
    assert answer.count(b"<redacted>") == 2 and answer.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("route", [RENDER, GENERATE])
def test_the_metadata_paths_prefill_render_and_prefill_legs(route: str) -> None:
    check(*ask(Echo("prefill", fail={route: 400}), Echo("decode"), PICTURE, metadata=True), 400)


@pytest.mark.parametrize(("route", "stream"), [(GENERATE, False), (DERENDER, False),
                                               (GENERATE, True)])  # fmt: skip
def test_the_metadata_paths_decode_and_derender_legs(route: str, stream: bool) -> None:
    body = {**PICTURE, "stream": stream}
    decode = Echo("decode", fail={route: 400})
    check(*ask(Echo("prefill"), decode, body, metadata=True), 400)


def test_a_derender_failing_after_the_first_event_ends_the_stream_redacted() -> None:
    events = [b'data: {"choices": [{"token_ids": [5]}]}\n\n'] * 2 + [b"data: [DONE]\n\n"]

    class Once(Echo):
        calls = 0

        async def serve(self, request: web.Request) -> web.StreamResponse:
            if request.path == DERENDER:
                Once.calls += 1
                self.fail = {DERENDER: 500} if Once.calls > 1 else {}
            return await super().serve(request)

    decode = Once("decode", pieces=events)
    status, answer = ask(Echo("prefill"), decode, {**PICTURE, "stream": True}, metadata=True)
    check(status, answer, 200)
    assert b"decode_worker_failed_to_start" in answer and answer.endswith(b"data: [DONE]\n\n")


def test_a_derendered_stream_that_quotes_a_key_is_relayed_redacted() -> None:
    events = [b'data: {"choices": [{"token_ids": [5]}]}\n\n', b"data: [DONE]\n\n"]
    said = {"chunk": {"choices": [{"delta": {"content": f"Bearer {WORKER_KEY}"}}]}}
    decode = Echo("decode", pieces=events, answers={DERENDER: {**said, "stream_state": 1}})
    status, answer = ask(Echo("prefill"), decode, {**PICTURE, "stream": True}, metadata=True)
    check(status, answer, 200)
    assert b'"content":"Bearer <redacted>"' in answer and answer.endswith(b"data: [DONE]\n\n")


def test_a_render_whose_answer_quotes_a_key_where_the_proxy_names_what_is_wrong() -> None:
    # The render's 200 answer names a modality after the key; the proxy's own 502 says
    # which modality it does not know: worker text in an error no worker sent.
    render = render_response()
    features = render["features"]
    for part in ("mm_hashes", "mm_placeholders", "mm_metadata"):
        features[part] = {WORKER_KEY: features[part]["image"]}
    prefill = Echo("prefill", answers={RENDER: render})
    check(*ask(prefill, Echo("decode"), PICTURE, metadata=True), 502)


@pytest.mark.parametrize("route", [RENDER, GENERATE])
def test_an_encoder_that_quotes_the_keys_in_its_error(route: str) -> None:
    encoder = Echo("encode", fail={route: 400})
    check(*ask(Echo("prefill"), Echo("decode"), PICTURE, encoder=encoder, metadata=True), 400)


def test_the_models_a_worker_lists_are_relayed_redacted() -> None:
    async def go() -> tuple[int, bytes]:
        async with (
            behind_proxy(Echo("prefill"), Echo("decode")) as (session, url),
            session.get(url + "/v1/models") as answer,
        ):
            return answer.status, await answer.read()

    check(*asyncio.run(go()), 200)

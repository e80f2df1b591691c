"""The proxy against stand-in workers, for the faults a real ``vllm serve`` cannot be made to
show: a prefill that answers 200 with a body that is not JSON or has no ids, a decode
that drops the connection mid-stream, a body that is not a JSON object. (The real
peers are in ``tests/vllm/http``.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability, plan_kv_handoff
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.plan.legs import prefill_body
from pd_policy_vllm.openai.plan.request import Route

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
LM_ONLY = WorkerCapability(Support.FALSE)


def chat(*, image: bool = True, stream: bool = False) -> dict[str, Any]:
    content: list[Any] = [{"type": "text", "text": "what is it?"}]
    if image:
        content.insert(0, IMAGE)
    return {"model": "m", "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, "stream": stream}  # fmt: skip


def good_prefill(ids: Any = (1, 2, 3)) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(
            {
                "prompt_token_ids": list(ids),
                "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "t"},
            }
        )

    return handler


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _through_proxy(
    prefill: Handler, decode: Handler, body: bytes, seen: list[str],
    path: str = "/v1/chat/completions", decode_capability: WorkerCapability = LM_ONLY,
    kv: KvConnectorMode = KvConnectorMode.TRANSFER,
) -> tuple[int, dict[str, str], bytes]:  # fmt: skip
    """Serve the stand-ins and a proxy in front of them, send ``body``, return the answer."""
    runners = []
    try:
        urls = []
        for name, handler in (("prefill", prefill), ("decode", decode)):

            async def recorded(request: web.Request, h: Handler = handler, n: str = name) -> Any:
                seen.append(n)
                return await h(request)

            app = web.Application()
            app.router.add_post("/v1/chat/completions", recorded)
            app.router.add_post("/v1/responses", recorded)
            runner, url = await _serve(app)
            runners.append(runner)
            urls.append(url)
        proxy = Proxy(
            HttpWorker(urls[0], kv=PrefillKv(kv)),
            [HttpWorker(urls[1], decode_capability)],
            mrope=False,
        )
        runner, url = await _serve(proxy.app())
        runners.append(runner)
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{url}{path}", data=body) as response,
        ):
            return response.status, dict(response.headers), await response.read()
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


def run(
    prefill: Handler, decode: Handler, body: Any, path: str = "/v1/chat/completions",
    decode_capability: WorkerCapability = LM_ONLY, kv: KvConnectorMode = KvConnectorMode.TRANSFER,
) -> tuple[int, dict[str, str], bytes, list[str]]:  # fmt: skip
    seen: list[str] = []
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, headers, answer = asyncio.run(
        _through_proxy(prefill, decode, raw, seen, path, decode_capability, kv)
    )
    return status, headers, answer, seen


async def never(request: web.Request) -> web.Response:
    raise AssertionError("this worker must not be called")


async def decode_ok(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"choices": [{"message": {"content": "ok"}}]})


def test_a_prefill_answering_200_with_a_body_that_is_not_json_is_a_502() -> None:
    async def garbage(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="<html>proxy error</html>", content_type="application/json")

    status, headers, answer, seen = run(garbage, never, chat())
    error = json.loads(answer)["error"]
    assert status == 502 and seen == ["prefill"]
    assert "the prefill response is not JSON" in error["message"]
    assert headers["X-SMG-Error-Code"] == error["code"]


def test_a_prefill_answering_without_ids_is_a_502_and_decode_is_never_called() -> None:
    for ids in ([], [1, True], [1, -2], ["7"]):
        status, _, answer, seen = run(good_prefill(ids), never, chat())
        assert status == 502, ids
        assert "prompt_token_ids" in json.loads(answer)["error"]["message"]
        assert seen == ["prefill"]


def test_a_body_that_is_not_a_json_object_is_a_400_before_any_worker() -> None:
    for body in (b"{", b"[1, 2]", b'{"messages": NaN}', b"\xff"):
        status, headers, answer, seen = run(never, never, body)
        error = json.loads(answer)["error"]
        assert status == 400 and seen == [], body
        assert error["param"] == "body"
        assert headers["X-SMG-Error-Code"] == error["code"]


def test_the_non_streamed_decode_answer_is_passed_on_byte_for_byte() -> None:
    exact = b'{"choices":[{"message":{"content":"ok"}}],  "extra": 1.0e+2}'

    async def decode(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=exact, content_type="application/json")

    status, _, answer, seen = run(good_prefill(), decode, chat())
    assert (status, answer, seen) == (200, exact, ["prefill", "decode"])


def test_a_decode_that_drops_mid_stream_ends_the_stream_with_an_error_event() -> None:
    async def dropping(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
        assert request.transport is not None
        request.transport.close()  # the worker dies mid-stream
        return response

    status, _, answer, _ = run(good_prefill(), dropping, chat(stream=True))
    events = [line[6:] for line in answer.decode().splitlines() if line.startswith("data: ")]
    assert status == 200  # the status line went out with the first event
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "a"
    assert json.loads(events[-2])["error"]["code"] == "decode_stream_error"
    assert events[-1] == "[DONE]"


@pytest.mark.parametrize("repeat", [300, 20_000])  # one write; the image a write of its own
def test_the_prefill_leg_is_the_clients_bytes_with_only_the_changed_members_rewritten(
    repeat: int,
) -> None:
    # Written as a client may write it (spaces, an escaped slash, the cap before the
    # messages): the prefill must get the messages, image included, byte for byte, and
    # a body that parses to the leg the policy builds by parsing.
    image = "data:image/png;base64," + "iVBORw0KGgo/" * repeat
    messages = json.dumps(chat()["messages"]).replace("data:image/png;base64,AAAA", image)
    messages = messages.replace("/", "\\/")  # JSON may escape a slash
    raw = ('{"model": "m",  "max_tokens": 4, "stream": false, "messages": ' + messages
           + ', "top_k": 3}').encode()  # fmt: skip
    received: list[bytes] = []

    async def prefill(request: web.Request) -> web.StreamResponse:
        received.append(await request.read())
        assert request.content_length == len(received[-1])
        return await good_prefill()(request)

    status, _, _, seen = run(prefill, decode_ok, raw)
    assert (status, seen) == (200, ["prefill", "decode"])
    (leg,) = received
    assert messages.encode() in leg  # the client's bytes, not the body written again
    handoff = plan_kv_handoff(PrefillKv(KvConnectorMode.TRANSFER), n=1)
    assert json.loads(leg) == prefill_body(json.loads(raw), Route.CHAT, handoff)


@pytest.mark.parametrize("vision", [False, True])
def test_a_long_image_reaches_each_leg_that_keeps_it_as_the_client_wrote_it(vision: bool) -> None:
    # Kept in the client's bytes while the proxy plans (skimmed): the prefill leg, and a
    # vision decode's leg, carry the URL byte for byte; a stripped leg carries none of it.
    image = "data:image/png;base64," + "iVBORw0KGgoA" * 2000
    body = chat()
    body["messages"][0]["content"][0]["image_url"]["url"] = image
    received: dict[str, bytes] = {}

    async def prefill(request: web.Request) -> web.StreamResponse:
        received["prefill"] = await request.read()
        return await good_prefill()(request)

    async def decode(request: web.Request) -> web.StreamResponse:
        received["decode"] = await request.read()
        return await decode_ok(request)

    capability = WorkerCapability(Support.TRUE) if vision else LM_ONLY
    status, _, _, seen = run(prefill, decode, body, decode_capability=capability)
    assert (status, seen) == (200, ["prefill", "decode"])
    quoted = json.dumps(image).encode()
    assert quoted in received["prefill"]
    assert (quoted in received["decode"]) is vision
    leg = json.loads(received["decode"])
    urls = [p["image_url"]["url"] for p in leg["messages"][0]["content"] if "image_url" in p]
    assert urls == ([image] if vision else [])


def test_a_responses_request_prefills_its_chat_equivalent_written_anew() -> None:
    # Its body is not the chat body planned: the client's bytes must not be spliced.
    body = {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}],
        "max_output_tokens": 4}  # fmt: skip
    received: list[bytes] = []

    async def prefill(request: web.Request) -> web.StreamResponse:
        received.append(await request.read())
        return await good_prefill()(request)

    _, _, _, seen = run(prefill, decode_ok, body, path="/v1/responses")
    assert seen[0] == "prefill"
    leg = json.loads(received[0])
    assert "messages" in leg and "input" not in leg

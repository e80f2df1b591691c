"""A failed KV transfer through the proxy, over stand-in workers described as NIXL: never a
200. The same faults on vLLM's own NixlConnector are in
``tests/vllm/http/test_http_nixl_failures_live.py``.

- A decode whose KV load failed answers as vLLM 0.32 does with ``kv_load_failure_policy``
  ``"fail"``: a 500 whole, and streamed a 200 whose first event is the role and whose
  next is the error. The proxy holds a stream's head until its first event that is not
  the role (``stream_head``), so the client gets a typed error either way.
- A prefill that answers past its lease on the KV (``kv_lease_duration``, read from its
  ``/server_info``): a decode would read freed blocks, so the handoff is not relayed
  (502 ``pd_kv_lease_expired``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web
from fleet_stands import FAILED_LOAD, ROLE, Stand, serving
from test_http_fleet import chat, post
from test_http_wires import described

from pd_policy import Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.proxy import Proxy

#: A token chunk of a chat stream, after the role.
TOKEN = (b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,'
         b'"model":"tiny","choices":[{"index":0,"delta":{"content":"hi"},"logprobs":null,'
         b'"finish_reason":null,"token_ids":[7]}]}\n\n')  # fmt: skip


def run(prefill: Stand, decodes: list[Stand], test: Any) -> None:
    async def main() -> None:
        async with described(prefill, decodes) as (url, _):
            await test(url)

    asyncio.run(main())


def test_a_failed_load_is_a_typed_error_whole_or_streamed_never_a_200() -> None:
    p, d = Stand("p", lm_only=False), Stand("d", load_fails=True)

    async def test(url: str) -> None:
        for stream in (False, True):
            status, body, text = await post(url, chat(stream=stream))
            assert status == 500, text  # not a 200 with vLLM's error after it
            assert body["error"]["code"] == "decode_worker_failed_to_start"
            assert "Internal server error" in body["error"]["message"]
        assert len(d.calls) == 2  # one decode leg each: no decode left to try again on

    run(p, [d], test)


def test_a_failed_load_is_tried_again_on_another_decode() -> None:
    p, broken, sound = Stand("p", lm_only=False), Stand("broken", load_fails=True), Stand("ok")

    async def test(url: str) -> None:
        for stream in (False, True, False, True):
            status, _, text = await post(url, chat(stream=stream))
            assert status == 200, text
            assert "sound" not in text and "ok" in text
        assert broken.calls  # placed there, failed, and tried again on the other

    run(p, [broken, sound], test)


async def streamed_through_the_proxy(events: list[bytes]) -> tuple[int, str]:
    """A chat stream through the proxy, over a decode that answers with ``events`` (each a
    whole event): the client's status and what it read."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(event)
        return response

    decode = web.Application()
    decode.router.add_post("/v1/chat/completions", answer)
    p = Stand("p", lm_only=False)
    async with serving(decode) as d_url, serving(p.app()) as p.url:
        proxy = Proxy(
            HttpWorker(p.url, WorkerCapability(Support.TRUE)),
            [HttpWorker(d_url, WorkerCapability(Support.FALSE))],
            mrope=False,
        )
        async with serving(proxy.app()) as url:
            status, _, text = await post(url, chat(stream=True))
    return status, text


def test_a_started_stream_goes_out_as_the_decode_sent_it() -> None:
    # The roles, held until the first token's event came, then all of it, byte for byte.
    events = [ROLE, ROLE.replace(b'"index":0', b'"index":1'), TOKEN, b"data: [DONE]\n\n"]
    status, text = asyncio.run(streamed_through_the_proxy(events))
    assert status == 200 and text.encode() == b"".join(events)


def test_an_error_after_the_first_token_ends_the_stream_it_cannot_retract() -> None:
    error = b"data: " + json.dumps(FAILED_LOAD).encode() + b"\n\n"
    events = [ROLE, TOKEN, error, b"data: [DONE]\n\n"]
    status, text = asyncio.run(streamed_through_the_proxy(events))
    assert status == 200 and text.encode() == b"".join(events)


def test_a_stream_of_only_preamble_goes_out_when_it_ends() -> None:
    status, text = asyncio.run(streamed_through_the_proxy([ROLE]))
    assert status == 200 and text.encode() == ROLE


LEASE = {"kv_connector_extra_config": {"kv_lease_duration": 2}}


def test_a_prefill_answer_past_its_lease_is_not_relayed() -> None:
    # A lease of 2 s leaves a decode leg 1 s of it (half of a short lease): a prefill that
    # takes 1.2 s has answered too late.
    p, d = Stand("p", lm_only=False, kv=dict(LEASE), delay=1.2), Stand("d")

    async def test(url: str) -> None:
        for stream in (False, True):
            status, body, text = await post(url, chat(stream=stream))
            assert status == 502, text
            assert body["error"]["code"] == "pd_kv_lease_expired"
        assert len(p.calls) == 2 and d.calls == []  # no decode leg: no retry on one prefill
        p.delay = 0.0
        status, _, text = await post(url, chat())
        assert status == 200, text
        assert len(d.calls) == 1

    run(p, [d], test)


def test_a_prefill_that_says_no_lease_gets_nixls_default() -> None:
    # NIXL's own default, 30 s: a prefill of 1.2 s is in time.
    p, d = Stand("p", lm_only=False, delay=1.2), Stand("d")

    async def test(url: str) -> None:
        status, _, text = await post(url, chat())
        assert status == 200, text

    run(p, [d], test)

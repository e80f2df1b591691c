"""A client's router-owned fields never reach a worker, through a live proxy in every form.

The proxy runs in front of recording stand-ins (tests/http/recording_workers.py) in five
fleets: P/D on NIXL, P/D whose prefill hands nothing over, passthrough, the M-RoPE metadata
path, and E/P/D. A client's ``kv_transfer_params``, ``ec_transfer_params`` and their twins
in ``vllm_xargs`` carry a canary; the canary must never be in any byte a worker received,
on any route (chat, completions, responses), stream or not, n=1 or n>1, text or image. The
request's id a worker sees is the proxy's own, unique per request; the client's is echoed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any, Final

import aiohttp
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from recording_workers import Recorder, serve

from pd_policy import (
    ROUTER_FIELDS,
    EncoderCacheRole,
    KvConnectorMode,
    OnClient,
    PrefillKv,
    RouterField,
    Support,
    WorkerCapability,
)
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.workers import HttpWorker

CANARY: Final = "canary-7f3a.evil.example"
URL: Final = "data:image/png;base64,QUJD"
IMAGE: Final = {"type": "image_url", "image_url": {"url": URL}}
VISION = WorkerCapability(Support.TRUE)
LM_ONLY = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.FALSE)
METADATA = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
SETUPS: Final = ("nixl", "no-handoff", "passthrough", "metadata", "epd")
ROUTES: Final = ("/v1/chat/completions", "/v1/completions", "/v1/responses")


class Fleets:
    """The five proxies, each over its own recording stand-ins, on a loop of their own."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = contextlib.AsyncExitStack()
        self.recorders: dict[str, list[Recorder]] = {}
        self.urls: dict[str, str] = {}
        self._run(self._start())

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _worker(self, recorder: Recorder) -> str:
        return await self.stack.enter_async_context(serve(recorder.app()))

    async def _start(self) -> None:
        self.session = await self.stack.enter_async_context(aiohttp.ClientSession())
        for name in SETUPS:
            prefill, decode, encoder = Recorder(handoff=name != "no-handoff"), Recorder(), None
            mode = KvConnectorMode.PASSTHROUGH if name == "passthrough" else KvConnectorMode.NIXL
            renders = name in ("metadata", "epd")
            consumer = EncoderCacheRole.CONSUMER if name == "epd" else EncoderCacheRole.UNKNOWN
            fleet = Fleet()
            capability = WorkerCapability(Support.TRUE, encoder_cache=consumer)
            fleet.add("prefill", HttpWorker(await self._worker(prefill), capability,
                                            PrefillKv(mode), renders=renders))  # fmt: skip
            decoding = METADATA if name == "metadata" else LM_ONLY
            fleet.add("decode", HttpWorker(await self._worker(decode), decoding, renders=renders))
            recorders = [prefill, decode]
            if name == "epd":
                encoder = Recorder()
                producer = WorkerCapability(Support.TRUE, encoder_cache=EncoderCacheRole.PRODUCER)
                fleet.add("encode", HttpWorker(await self._worker(encoder), producer, renders=True))
                recorders.append(encoder)
            proxy = Proxy(fleet=fleet, mrope=name == "metadata", log_requests=False)
            self.urls[name] = await self.stack.enter_async_context(serve(proxy.app()))
            self.recorders[name] = recorders

    async def _send(
        self, url: str, body: Any, headers: dict[str, str]
    ) -> tuple[int, dict[str, str], bytes]:
        async with self.session.post(url, data=json.dumps(body), headers=headers) as response:
            headers = {name.lower(): value for name, value in response.headers.items()}
            return response.status, headers, await response.read()

    def send(
        self, setup: str, route: str, body: Any, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        """The proxy's answer to ``body`` on ``route`` (its headers' names lower-cased); the
        setup's records are cleared first."""
        for recorder in self.recorders[setup]:
            recorder.calls.clear()
        answer: tuple[int, dict[str, str], bytes] = self._run(
            self._send(self.urls[setup] + route, body, headers or {})
        )
        return answer

    def received(self, setup: str) -> list[Any]:
        return [call for recorder in self.recorders[setup] for call in recorder.calls]

    def close(self) -> None:
        self._run(self.stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def fleets() -> Iterator[Fleets]:
    live = Fleets()
    try:
        yield live
    finally:
        live.close()


def body_for(route: str, *, n: int, stream: bool, image: bool) -> dict[str, Any]:
    """A request on ``route``: ``n`` samples, streamed or not, with an image or text only."""
    content: Any = [IMAGE, {"type": "text", "text": "what?"}] if image else "hi"
    base: dict[str, Any] = {"model": "m", "max_tokens": 4, "stream": stream}
    if n != 1:
        base["n"] = n
    if route == "/v1/completions":
        return {**base, "prompt": "hi"}
    if route == "/v1/responses":
        parts = ([{"type": "input_image", "image_url": URL}]
                 if image else [])  # fmt: skip
        text = [{"type": "input_text", "text": "what?"}]
        return {**base, "input": [{"role": "user", "content": parts + text}]}
    return {**base, "messages": [{"role": "user", "content": content}]}


def with_field(body: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = dict(body)
    if len(path) == 1:
        out[path[0]] = value
    else:
        out[path[0]] = {**out.get(path[0], {}), path[1]: value}
    return out


def leaked(fleets: Fleets, setup: str, canary: str = CANARY) -> list[str]:
    """The routes of the calls whose bytes or headers hold ``canary``."""
    return [call.route for call in fleets.received(setup)
            if canary.encode() in call.raw or canary in json.dumps(call.headers)]  # fmt: skip


HANDOFF = {"do_remote_prefill": True, "remote_engine_id": CANARY, "remote_block_ids": [9],
           "remote_host": CANARY, "remote_port": 6666, "prompt_token_ids": [1]}  # fmt: skip

# Each case that reached a worker before the front door refused router-owned fields.
CASES: Final = [
    ("nixl", "/v1/chat/completions", {"n": 2, "stream": False, "image": False}),
    ("no-handoff", "/v1/completions", {"n": 1, "stream": False, "image": False}),
    ("nixl", "/v1/responses", {"n": 2, "stream": False, "image": False}),
    ("passthrough", "/v1/chat/completions", {"n": 1, "stream": False, "image": False}),
    ("metadata", "/v1/chat/completions", {"n": 1, "stream": True, "image": True}),
    ("epd", "/v1/chat/completions", {"n": 1, "stream": False, "image": True}),
]


@pytest.mark.parametrize(("setup", "route", "form"), CASES)
@pytest.mark.parametrize("path", [("kv_transfer_params",), ("vllm_xargs", "kv_transfer_params")])
def test_a_clients_handoff_is_refused_before_any_worker(
    fleets: Fleets, setup: str, route: str, form: dict[str, Any], path: tuple[str, ...]
) -> None:
    body = with_field(body_for(route, **form), path, HANDOFF)
    status, headers, answer = fleets.send(setup, route, body)
    assert leaked(fleets, setup) == []
    assert (status, json.loads(answer)["error"]["code"]) == (400, "pd_router_owned_field")
    assert json.loads(answer)["error"]["param"] == ".".join(path)
    assert headers["x-smg-error-code"] == "pd_router_owned_field"
    assert fleets.received(setup) == []  # refused at the door: no worker called
    # The same request without the field is served, on the same fleet.
    assert fleets.send(setup, route, body_for(route, **form))[0] == 200


def test_the_workers_see_the_proxys_own_id_and_the_client_gets_its_own_back(
    fleets: Fleets,
) -> None:
    body = {**body_for("/v1/chat/completions", n=1, stream=False, image=True),
            "request_id": CANARY}  # fmt: skip
    seen: list[str] = []
    for _ in range(2):  # two requests under one client id: two ids at the workers
        status, headers, _ = fleets.send("nixl", "/v1/chat/completions", body,
                                         {"X-Request-Id": "client-7"})  # fmt: skip
        assert status == 200 and headers["x-request-id"] == "client-7"
        assert leaked(fleets, "nixl") == [] and leaked(fleets, "nixl", "client-7") == []
        ids = {call.headers["x-request-id"] for call in fleets.received("nixl")}
        assert len(ids) == 1  # one id on every leg of a request
        seen += ids
    assert len(set(seen)) == 2


def test_a_request_without_an_id_gets_the_proxys_own_back(fleets: Fleets) -> None:
    status, headers, _ = fleets.send(
        "nixl", "/v1/completions", body_for("/v1/completions", n=1, stream=False, image=False)
    )
    (call, *_) = fleets.received("nixl")
    assert status == 200 and headers["x-request-id"] == call.headers["x-request-id"]


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, dict[str, Any], list[Any]]:
    setup, route = draw(st.sampled_from(SETUPS)), draw(st.sampled_from(ROUTES))
    n, stream, image = draw(st.sampled_from([1, 2])), draw(st.booleans()), draw(st.booleans())
    refused = [f for f in ROUTER_FIELDS if f.on_client is OnClient.REFUSE]
    dropped = [f for f in ROUTER_FIELDS if f.on_client is OnClient.DROP]
    kind = draw(st.sampled_from(["none", "dropped", "refused"]))
    fields: list[RouterField] = []
    if kind != "none":
        fields = draw(st.lists(st.sampled_from(dropped), min_size=1, unique=True))
    if kind == "refused":
        fields += draw(st.lists(st.sampled_from(refused), min_size=1, max_size=3, unique=True))
    value = draw(st.sampled_from([HANDOFF, CANARY, [CANARY], {"x": CANARY}]))
    body = body_for(route, n=n, stream=stream, image=image)
    for field in fields:
        body = with_field(body, field.path, value)
    return setup, route, body, fields


@settings(max_examples=150)
@given(case=cases())
def test_no_router_owned_field_from_a_client_ever_reaches_a_worker(
    fleets: Fleets, case: tuple[str, str, dict[str, Any], list[Any]]
) -> None:
    setup, route, body, fields = case
    refused = [f for f in fields if f.on_client is OnClient.REFUSE]
    event(f"{setup}: {'refused' if refused else 'dropped' if fields else 'none'}")
    event(f"{route} n={body.get('n', 1)} stream={body['stream']}")
    status, _, answer = fleets.send(setup, route, body)
    event(f"answered {status}")
    assert leaked(fleets, setup) == []
    if refused:
        assert status == 400 and json.loads(answer)["error"]["code"] == "pd_router_owned_field"
        assert fleets.received(setup) == []
    elif setup == "no-handoff" and status == 502:
        # A stripped image leg whose prefill handed nothing over: refused, not image-blind.
        assert json.loads(answer)["error"]["code"] == "pd_decode_missing_kv_transfer_params"
    else:
        # Served, or refused by the policy for what the form cannot take (never a 5xx).
        assert status < 500, answer

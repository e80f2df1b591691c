"""The KV wires through the proxy: decodes described by their ``/server_info``, prefills by
theirs, and the route rule of NIXL push, over stand-in workers (a P2P tier does not start on
vLLM's CPU platform, and a recomputing decode answers 200 whatever it loaded: neither can
show its fault live here).

A decode whose connector matches blocks by content hash (the OffloadingConnector's P2P
tier), or that recomputes a failed load, must never get a stripped image leg: it would
answer image-blind, with a 200. NIXL push pairs the legs by request id *and* route: legs on
two routes would hang the decode for 480 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from fleet_stands import Stand, serving
from test_http_epd import answer, llava_render
from test_http_fleet import chat, post
from test_http_scale_out import METADATA, prefill_answer, render_response
from test_http_scale_out import chat as mrope_chat

from pd_policy import (
    DecodeCandidate,
    DecodeForm,
    KvConnectorMode,
    PrefillKv,
    Support,
    WorkerCapability,
)
from pd_policy.wire_errors import LegRoutesDiffer
from pd_policy_vllm.http import Route
from pd_policy_vllm.http.cli import read_fleet
from pd_policy_vllm.http.flags import parser
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.plan.responses import RESPONSES
from pd_policy_vllm.openai.plan.scale_out import GENERATE
from pd_policy_vllm.openai.plan.steps import (
    decode_leg,
    plan_encoded,
    plan_rendered,
    plan_request,
)

P2P: dict[str, Any] = {"kv_connector_extra_config": {
    "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 2**30,
    "secondary_tiers": [{"type": "p2p", "host": "127.0.0.1", "port": 5701}]}}  # fmt: skip
RECOMPUTE = {"kv_load_failure_policy": "recompute"}
PUSH = PrefillKv(KvConnectorMode.NIXL_PUSH)
#: What a push prefill returns (as pull does).
PUSHED = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [[0]],
          "remote_host": "h", "remote_port": 1, "transfer_mode": "push"}  # fmt: skip
LM_ONLY = WorkerCapability(Support.FALSE)
Test = Callable[[str, Stand, list[Stand]], Awaitable[None]]


def _blind(kind: str) -> Stand:
    """A language-model-only decode whose ``/server_info`` says it could answer blind."""
    if kind == "p2p":
        return Stand("blind", connector="OffloadingConnector", kv=dict(P2P))
    return Stand("blind", kv=dict(RECOMPUTE))


@contextlib.asynccontextmanager
async def described(
    prefill: Stand, decodes: list[Stand], *flags: str
) -> AsyncIterator[tuple[str, Proxy]]:
    """The proxy over stand-ins it reads as it reads ``vllm serve`` workers: each one's
    ``/server_info``, through the command line."""
    async with contextlib.AsyncExitStack() as stack:
        for stand in (prefill, *decodes):
            stand.url = await stack.enter_async_context(serving(stand.app()))
        argv = ["--prefill", prefill.url, "--no-mrope", *flags]
        for stand in decodes:
            argv += ["--decode", stand.url]
        proxy = Proxy(fleet=await read_fleet(parser().parse_args(argv)), mrope=False)
        yield await stack.enter_async_context(serving(proxy.app())), proxy


def run(test: Test, decodes: list[Stand], prefill: Stand | None = None) -> None:
    async def main() -> None:
        p = prefill or Stand("p", lm_only=False)
        async with described(p, decodes) as (url, _):
            await test(url, p, decodes)

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["p2p", "recompute"])
def test_image_requests_go_past_a_blind_decode_to_one_that_loads_the_transfer(kind: str) -> None:
    async def test(url: str, p: Stand, ds: list[Stand]) -> None:
        blind, sighted = ds
        answers = await asyncio.gather(*(post(url, chat(i)) for i in range(6)))
        assert [status for status, _, _ in answers] == [200] * 6
        assert all(body["worker"] == "sighted" for _, body, _ in answers)
        assert blind.calls == []  # never a stripped image leg
        assert len(sighted.calls) == 6

    run(test, [_blind(kind), Stand("sighted")])


@pytest.mark.parametrize("kind", ["p2p", "recompute"])
def test_with_only_a_blind_decode_an_image_is_refused_typed_and_text_still_served(
    kind: str,
) -> None:
    async def test(url: str, p: Stand, ds: list[Stand]) -> None:
        (blind,) = ds
        status, body, _ = await post(url, chat())
        assert status == 400
        assert body["error"]["code"] == "pd_decode_blind_to_media"
        assert blind.calls == [] and p.calls == []  # refused before any leg
        status, body, _ = await post(url, chat(image=False))
        assert status == 200 and body["worker"] == "blind"  # text is served there
        assert len(blind.calls) == 1 and len(p.calls) == 1

    run(test, [_blind(kind)])


def test_a_decode_that_does_not_describe_itself_is_described_by_the_flags() -> None:
    # --decode-kv-transfer-config is the worker's own --kv-transfer-config, for a worker
    # outside development mode: the same rule as /server_info.
    async def main() -> None:
        p, d = Stand("p", lm_only=False), Stand("d", describes=False)
        flags = ["--decode-capability", "lm-only", "--decode-kv-transfer-config",
                 '{"kv_connector": "NixlConnector", "kv_role": "kv_consumer", '
                 '"kv_load_failure_policy": "recompute"}']  # fmt: skip
        async with described(p, [d], *flags) as (url, _):
            status, body, _ = await post(url, chat())
            assert (status, body["error"]["code"]) == (400, "pd_decode_blind_to_media")
            assert d.calls == []

    asyncio.run(main())


def test_a_push_prefill_is_served_with_one_request_id_on_one_route() -> None:
    # vLLM 0.32's NixlPushConnector returns what pull returns: the proxy used to refuse to
    # start ("unknown KV connector"). Served, both legs carry the request's one id.
    async def test(url: str, p: Stand, ds: list[Stand]) -> None:
        status, body, _ = await post(url, chat())
        assert status == 200 and body["form"] == "stripped"
        (prefill,), (decode,) = p.calls, ds[0].calls
        assert prefill["path"] == decode["path"] == Route.CHAT.value
        assert prefill["request_id"] == decode["request_id"] is not None
        assert prefill["body"]["kv_transfer_params"]["do_remote_decode"] is True

    run(test, [Stand("d")], prefill=Stand("p", lm_only=False, connector="NixlPushConnector"))


async def _responses(url: str) -> tuple[int, Any]:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    body = {"model": "tiny", "max_output_tokens": 4,
            "input": [{"role": "user", "content": [image, {"type": "input_text",
                                                           "text": "what?"}]}]}  # fmt: skip
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}{RESPONSES}", json=body
    ) as response:  # fmt: skip
        return response.status, await response.json()


@pytest.mark.parametrize("stated", [None, "nixl"])
def test_push_legs_on_two_routes_are_refused_before_any_leg(stated: str | None) -> None:
    # The Responses API prefills as chat (chatcmpl-<id>) and decodes on /v1/responses
    # (resp_...): a push decode would wait out its registration. Stated `--kv-mode nixl`
    # (today's workaround) does not hide the push connector the prefill describes.
    async def main() -> None:
        p = Stand("p", lm_only=False, connector="NixlPushConnector")
        d = Stand("d")
        flags = ["--kv-mode", stated] if stated else []
        async with described(p, [d], *flags) as (url, _):
            status, body = await _responses(url)
            assert (status, body["error"]["code"]) == (400, "pd_handoff_routes_differ")
            assert p.calls == [] and d.calls == []

    asyncio.run(main())


def test_a_pull_prefill_serves_the_responses_api_as_before() -> None:
    async def main() -> None:
        p, d = Stand("p", lm_only=False), Stand("d")
        async with described(p, [d]) as (url, _):
            status, _ = await _responses(url)
            assert status == 200
            assert [c["path"] for c in p.calls + d.calls] == [Route.CHAT.value, RESPONSES]

    asyncio.run(main())


# --- the routes each plan sends its legs to, under push --------------------------------


def test_the_metadata_path_sends_both_legs_to_generate_under_push() -> None:
    # An M-RoPE image on a decode that takes metadata: rendered, prefilled and decoded on
    # /inference/v1/generate; one route, so push pairs them.
    planned = plan_request(mrope_chat(), Route.CHAT, [DecodeCandidate(METADATA, 0)], PUSH,
                           mrope=True, request_id="r", renders=True)  # fmt: skip
    render = render_response()
    planned = plan_rendered(planned, render)
    assert planned.form is DecodeForm.MROPE_METADATA
    leg = decode_leg(planned, prefill_answer(render, PUSHED))
    assert planned.prefill_route == leg.route == GENERATE


def test_epd_with_metadata_is_served_and_without_it_refused_under_push() -> None:
    # Qwen2-VL in E/P/D: the prefill and the metadata decode both on generate. LLaVA
    # publishes no metadata: its prefill goes to generate, its stripped decode to chat.
    qwen = plan_request(mrope_chat(), Route.CHAT, [DecodeCandidate(METADATA, 0)], PUSH,
                        mrope=True, request_id="r", renders=True, encodes=True)  # fmt: skip
    render = render_response()
    qwen = plan_encoded(plan_rendered(qwen, render), answer(render, metadata=True))
    assert qwen.prefill_route == decode_leg(qwen, prefill_answer(render, PUSHED)).route == GENERATE
    with pytest.raises(LegRoutesDiffer) as caught:
        plan_request(mrope_chat(), Route.CHAT, [DecodeCandidate(LM_ONLY, 0)], PUSH,
                     mrope=False, request_id="r", renders=True, encodes=True)  # fmt: skip
    assert caught.value.status == 400 and not caught.value.retryable
    assert GENERATE in caught.value.message and Route.CHAT.value in caught.value.message
    # Under pull the same LLaVA request is served, as before.
    pull = PrefillKv(KvConnectorMode.NIXL)
    llava = plan_request(mrope_chat(), Route.CHAT, [DecodeCandidate(LM_ONLY, 0)], pull,
                         mrope=False, request_id="r", renders=True, encodes=True)  # fmt: skip
    llava = plan_encoded(
        plan_rendered(llava, llava_render()), answer(llava_render(), metadata=False)
    )
    assert llava.prefill_route == GENERATE


@pytest.mark.parametrize("route", list(Route))
def test_chat_and_completions_keep_one_route_under_push(route: Route) -> None:
    body = chat() if route is Route.CHAT else {"model": "m", "prompt": "hi", "max_tokens": 3}
    planned = plan_request(body, route, [DecodeCandidate(LM_ONLY, 0)], PUSH, mrope=False,
                           request_id="r")  # fmt: skip
    reply = {"prompt_token_ids": [1, 2, 3], "choices": [{"prompt_token_ids": [1, 2, 3]}],
             "kv_transfer_params": PUSHED}  # fmt: skip
    assert planned.prefill_route == decode_leg(planned, reply).route == route.value


def test_n_samples_run_no_prefill_so_no_route_is_shared() -> None:
    planned = plan_request(chat(image=False) | {"n": 2}, Route.CHAT, [DecodeCandidate(LM_ONLY, 0)],
                           PUSH, mrope=False, request_id="r", served_as=RESPONSES)  # fmt: skip
    assert planned.prefill is None

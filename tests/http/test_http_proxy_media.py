"""The proxy's remote media modes against stand-in workers and a media server whose one URL
serves new bytes each time: what each leg carries, and what the decode's salt is. (The
real workers' answers are in ``tests/vllm/http``.)"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pd_policy import KvConnectorMode, MediaFetchRules, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.media.fetch import PINNED_MEDIA_TYPE, RemoteMedia
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.planning import remote_media_for
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.identity import WorkerMedia


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _run(mode: RemoteMedia, requests: int) -> tuple[list[Any], list[Any], list[Any]]:
    """Send ``requests`` chat requests for one remote URL through a proxy in ``mode``: the
    answers, and the prefill and decode legs the stand-ins received."""
    frames: list[int] = []
    prefills: list[Any] = []
    decodes: list[Any] = []

    async def latest(request: web.Request) -> web.Response:
        frames.append(len(frames) + 1)
        return web.Response(body=f"frame {len(frames)}".encode())

    async def prefill(request: web.Request) -> web.Response:
        prefills.append(await request.json())
        return web.json_response(
            {
                "prompt_token_ids": [1, 2, 3],
                "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "t"},
            }
        )

    async def decode(request: web.Request) -> web.Response:
        decodes.append(await request.json())
        return web.json_response({"choices": []})

    runners = []
    try:
        urls = []
        for route, handler in (("/latest.jpg", latest), ("/v1/chat/completions", prefill),
                               ("/v1/chat/completions", decode)):  # fmt: skip
            app = web.Application()
            app.router.add_route("*", route, handler)
            runner, url = await _serve(app)
            runners.append(runner)
            urls.append(url)
        rules = MediaFetchRules(allowed_domains=["127.0.0.1"], known=True)
        proxy = Proxy(
            HttpWorker(urls[1], kv=PrefillKv(KvConnectorMode.TRANSFER), media=WorkerMedia(rules)),
            [HttpWorker(urls[2], WorkerCapability(Support.FALSE))],
            mrope=False,
            remote_media=mode,
            # The media server is on 127.0.0.1, which the proxy refuses by default.
            media_limits=MediaLimits(allow_private_hosts=True),
        )
        runner, proxy_url = await _serve(proxy.app())
        runners.append(runner)
        part = {"type": "image_url", "image_url": {"url": urls[0] + "/latest.jpg"}}
        content = [part, {"type": "text", "text": "?"}]
        body = {"model": "m", "max_tokens": 2, "cache_salt": "tenant",
                "messages": [{"role": "user", "content": content}]}  # fmt: skip
        answers = []
        async with aiohttp.ClientSession() as session:
            for _ in range(requests):
                async with session.post(proxy_url + "/v1/chat/completions", json=body) as r:
                    answers.append((r.status, await r.json()))
        return answers, prefills, decodes
    finally:
        for runner in runners:
            await runner.cleanup()


def _image_url(leg: Any) -> str:
    url: str = leg["messages"][0]["content"][0]["image_url"]["url"]
    return url


def test_fetch_mode_sends_the_fetched_bytes_to_the_prefill_and_salts_by_them() -> None:
    answers, prefills, decodes = asyncio.run(_run(RemoteMedia.FETCH, 2))
    assert [status for status, _ in answers] == [200, 200]
    prefix = f"data:{PINNED_MEDIA_TYPE};base64,"
    sent = [_image_url(leg) for leg in prefills]
    assert all(u.startswith(prefix) for u in sent)
    assert [base64.b64decode(u[len(prefix) :]) for u in sent] == [b"frame 1", b"frame 2"]
    # New bytes at the same URL: another item, so another decode salt.
    salts = [leg["cache_salt"] for leg in decodes]
    assert salts[0] != salts[1] and all(s.startswith("mm1:") for s in salts)
    assert all("image_url" not in json.dumps(leg["messages"]) for leg in decodes)


def test_uncached_mode_sends_the_url_and_shares_no_salt_across_requests() -> None:
    answers, prefills, decodes = asyncio.run(_run(RemoteMedia.UNCACHED, 2))
    assert [status for status, _ in answers] == [200, 200]
    assert all(_image_url(leg).endswith("/latest.jpg") for leg in prefills)
    assert decodes[0]["cache_salt"] != decodes[1]["cache_salt"]


def test_refuse_mode_refuses_before_any_worker() -> None:
    answers, prefills, decodes = asyncio.run(_run(RemoteMedia.REFUSE, 1))
    ((status, answer),) = answers
    assert status == 400 and answer["error"]["code"] == "pd_media_refused"
    assert answer["error"]["param"] == "messages[0].content[0]"
    assert "127.0.0.1" not in json.dumps(answer)
    assert prefills == [] and decodes == []


def test_a_proxy_that_does_not_know_the_workers_rules_does_not_fetch() -> None:
    worker = HttpWorker("http://127.0.0.1:1", kv=PrefillKv(KvConnectorMode.TRANSFER))
    decode = [HttpWorker("http://127.0.0.1:2", WorkerCapability(Support.FALSE))]
    proxy = Proxy(worker, decode, mrope=False)
    (member,) = proxy.fleet.of("prefill")
    assert remote_media_for(proxy.remote_media, member) is RemoteMedia.UNCACHED
    with pytest.raises(ValueError, match="media rules"):
        Proxy(worker, decode, mrope=False, remote_media=RemoteMedia.FETCH)

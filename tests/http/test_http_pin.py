"""Remote media fetched once by the proxy, within the worker's rules, against a real HTTP
media server on 127.0.0.1 (``localhost`` is a second host name for it): new content at
one URL, redirects, sizes, time-outs, and errors."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from pd_policy import (
    MediaFetchFailed,
    MediaFetchRules,
    MediaRefused,
    MediaUnreachable,
    Modality,
    PolicyError,
)
from pd_policy_vllm.http.media.fetch import PINNED_MEDIA_TYPE, fetch_media
from pd_policy_vllm.http.media.guard import MediaLimits, media_session
from pd_policy_vllm.http.media.pinning import pin_remote_media
from pd_policy_vllm.openai.wire.data_url import DataUrl

#: The media server is on 127.0.0.1, which the proxy refuses by default
#: (tests/http/test_http_media_fetch_ssrf.py): these tests run as a lab would.
LAB = MediaLimits(allow_private_hosts=True)


class MediaServer:
    """An HTTP media server whose ``/latest.jpg`` serves new bytes on every request."""

    def __init__(self) -> None:
        self.served = 0
        self.port = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/latest.jpg", self.latest)
        app.router.add_get("/to-latest", self.to_latest)
        app.router.add_get("/to-other-host", self.to_other_host)
        app.router.add_get("/loop", self.loop)
        app.router.add_get("/big", self.big)
        app.router.add_get("/big-chunked", self.big_chunked)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/status/{code}", self.status)
        return app

    async def latest(self, request: web.Request) -> web.Response:
        self.served += 1
        return web.Response(body=f"frame {self.served}".encode(), content_type="image/jpeg")

    async def to_latest(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/latest.jpg")

    async def to_other_host(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://localhost:{self.port}/latest.jpg")

    async def loop(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/loop")

    async def big(self, request: web.Request) -> web.Response:
        return web.Response(body=b"x" * 2000)

    async def big_chunked(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(20):
            await response.write(b"x" * 100)
        return response

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(1)
        return web.Response(body=b"late")

    async def status(self, request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]))


Fixture = tuple[MediaServer, str, aiohttp.ClientSession]


def served(test: Callable[[Fixture], Awaitable[None]]) -> None:
    """Run ``test`` against a fresh media server on 127.0.0.1, in one event loop."""

    async def main() -> None:
        server = MediaServer()
        runner = web.AppRunner(server.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        server.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with media_session(LAB) as session:
                await test((server, f"http://127.0.0.1:{server.port}", session))
        finally:
            await runner.cleanup()

    asyncio.run(main())


RULES = MediaFetchRules(allowed_domains=["127.0.0.1"], max_download_bytes=1000, known=True)


async def fetch(media: Fixture, path: str, rules: MediaFetchRules = RULES) -> bytes:
    _, base, session = media
    return await fetch_media(session, base + path, Modality.IMAGE, rules, param="item", limits=LAB)


def test_each_fetch_reads_what_the_url_serves_now() -> None:
    async def test(media: Fixture) -> None:
        assert await fetch(media, "/latest.jpg") == b"frame 1"
        assert await fetch(media, "/latest.jpg") == b"frame 2"
        assert await fetch(media, "/to-latest") == b"frame 3"  # a redirect within the rules

    served(test)


@pytest.mark.parametrize(
    ("path", "rules", "error", "status"),
    [
        # The proxy checks every redirect against the allowed domains (vLLM checks the first).
        ("/to-other-host", RULES, MediaRefused, 400),
        ("/loop", RULES, MediaFetchFailed, 422),
        # A worker that follows no redirect answers the redirect itself, an error.
        ("/to-latest", MediaFetchRules(allow_redirects=False, known=True), MediaFetchFailed, 422),
        ("/big", RULES, MediaFetchFailed, 422),
        ("/big-chunked", RULES, MediaFetchFailed, 422),
        ("/status/404", RULES, MediaFetchFailed, 422),
        ("/status/500", RULES, MediaUnreachable, 504),
        ("/status/429", RULES, MediaUnreachable, 504),
        ("/slow", MediaFetchRules(timeouts={Modality.IMAGE: 0.2}, known=True), MediaUnreachable,
         504),
    ],
)  # fmt: skip
def test_what_the_worker_would_not_take_is_a_typed_error_naming_the_item(
    path: str, rules: MediaFetchRules, error: type[PolicyError], status: int
) -> None:
    async def test(media: Fixture) -> None:
        with pytest.raises(error) as caught:
            await fetch(media, path, rules)
        assert caught.value.status == status and caught.value.param == "item"
        assert "127.0.0.1" not in caught.value.message and path not in caught.value.message
        assert caught.value.retryable is (status == 504)

    served(test)


def test_a_host_that_is_not_there_is_unreachable() -> None:
    async def test(media: Fixture) -> None:
        with pytest.raises(MediaUnreachable):
            # Port 9 (discard) has no listener here: the connection is refused.
            await fetch_media(
                media[2], "http://127.0.0.1:9/x", Modality.IMAGE, RULES, param="p", limits=LAB
            )

    served(test)


def test_pinning_replaces_only_unnamed_remote_urls_and_keeps_the_body() -> None:
    async def test(media: Fixture) -> None:
        _, base, session = media
        inline = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
        named = {"type": "image_url", "image_url": {"url": base + "/status/404"}, "uuid": "u"}
        remote = {"type": "image_url", "image_url": {"url": base + "/latest.jpg", "detail": "low"}}
        simple = {"type": "input_image", "image_url": base + "/latest.jpg"}
        video = {"type": "video_url", "video_url": {"url": base + "/latest.jpg"}}
        content: list[Any] = [inline, named, remote, {"type": "text", "text": "hi"}, simple, video]
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": content}]}
        body["n"] = 1
        pinned = await pin_remote_media(session, body, RULES, LAB)
        assert body["messages"][0]["content"][2] is remote  # the client's body is untouched
        got = pinned["messages"][0]["content"]
        assert got[0] == inline and got[1] == named and got[3] == content[3]
        assert got[2]["image_url"]["detail"] == "low"
        # Each a DataUrl of its bytes, hashed already (in a worker thread).
        kept = [got[2]["image_url"]["url"], got[4]["image_url"], got[5]["video_url"]["url"]]
        assert all(isinstance(u, DataUrl) and u.hashed for u in kept)
        urls = [str(u) for u in kept]
        prefix = f"data:{PINNED_MEDIA_TYPE};base64,"
        assert all(u.startswith(prefix) for u in urls)
        frames = sorted(base64.b64decode(u[len(prefix) :]) for u in urls)
        assert frames == [b"frame 1", b"frame 2", b"frame 3"]  # fetched once each
        assert pinned["n"] == 1

    served(test)

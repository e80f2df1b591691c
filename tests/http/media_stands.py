"""A real media host on 127.0.0.1 and a proxy that fetches from it, over stand-in workers:
what the host was asked (each request's path, its cookie and authorization headers, the
client port it came from), and what each worker received.

The media host's routes: ``/frame`` serves new bytes on each request; ``/set-cookie``
sets a session cookie as a host a tenant logged in to would; ``/to-frame`` redirects to
``/frame``, and ``/to-localhost`` to it on ``localhost`` (a second name for the same
host); ``/big/{n}`` serves ``n`` bytes. ``localhost`` is the name to fetch by: a cookie
jar takes no cookie from an address.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
import attrs
from aiohttp import web
from fleet_stands import Stand, serving

from pd_policy import MediaFetchRules, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.front_door import FrontDoor
from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.identity import WorkerMedia

__all__ = ["KEYS", "MediaHost", "Served", "chat", "media_proxy", "post"]

#: The media host is on 127.0.0.1, which the proxy refuses by default: run as a lab.
LAB = MediaLimits(allow_private_hosts=True, timeout=10)
#: Two tenants' keys.
KEYS = Keys(None, ("key-a", "key-b"))


@attrs.define
class MediaHost:
    """A media host; ``asked`` is each request's path, ``Cookie`` and ``Authorization``
    headers and client port, in order."""

    asked: list[dict[str, Any]] = attrs.field(factory=list)
    frames: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/frame", self.frame)
        app.router.add_get("/set-cookie", self.set_cookie)
        app.router.add_get("/to-frame", self.to_frame)
        app.router.add_get("/to-localhost", self.to_localhost)
        app.router.add_get("/big/{n}", self.big)
        app.middlewares.append(self.record)
        return app

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.asked.append({"path": request.path, "cookie": request.headers.get("Cookie"),
                           "authorization": request.headers.get("Authorization"),
                           "port": peer[1] if peer else None})  # fmt: skip
        response: web.StreamResponse = await handler(request)
        return response

    async def frame(self, request: web.Request) -> web.Response:
        self.frames += 1
        return web.Response(body=f"frame {self.frames}".encode(), content_type="image/png")

    async def set_cookie(self, request: web.Request) -> web.Response:
        response = web.Response(body=b"tenant a's image", content_type="image/png")
        response.set_cookie("session", "tenant-a-secret", path="/")
        return response

    async def to_frame(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/frame")

    async def to_localhost(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://localhost:{request.url.port}/frame")

    async def big(self, request: web.Request) -> web.Response:
        return web.Response(body=b"x" * int(request.match_info["n"]), content_type="image/png")


@attrs.frozen
class Served:
    """A proxy over stand-ins, and the media host it fetches from (at ``media``, by the
    name ``localhost``)."""

    url: str
    media: str
    host: MediaHost
    prefills: list[Stand]
    decodes: list[Stand]
    proxy: Proxy


@contextlib.asynccontextmanager
async def media_proxy(
    rules: Sequence[MediaFetchRules],
    *,
    limits: MediaLimits = LAB,
    door: FrontDoor | None = None,
    attempts: int = 2,
) -> AsyncIterator[Served]:
    """A proxy that fetches remote media (``--remote-media fetch``) with ``limits``, over
    one full-vision prefill stand-in for each of ``rules`` (its media rules) and one
    language-model-only decode, with the clients' ``KEYS``."""
    host = MediaHost()
    prefills = [Stand(f"p{i}", lm_only=False) for i in range(len(rules))]
    decodes = [Stand("d0")]
    async with contextlib.AsyncExitStack() as stack:
        media = await stack.enter_async_context(serving(host.app()))
        for stand in prefills + decodes:
            stand.url = await stack.enter_async_context(serving(stand.app()))
        fleet = Fleet()
        for stand, rule in zip(prefills, rules, strict=True):
            worker = HttpWorker(stand.url, WorkerCapability(Support.TRUE), media=WorkerMedia(rule))
            fleet.add("prefill", worker, healthy=True)
        decode = HttpWorker(decodes[0].url, WorkerCapability(Support.FALSE))
        fleet.add("decode", decode, healthy=True)
        proxy = Proxy(fleet=fleet, mrope=False, remote_media=RemoteMedia.FETCH, keys=KEYS,
                      media_limits=limits, log_requests=False, front_door=door,
                      attempts=attempts)  # fmt: skip
        url = await stack.enter_async_context(serving(proxy.app()))
        media = media.replace("127.0.0.1", "localhost")
        yield Served(url, media, host, prefills, decodes, proxy)


def chat(*urls: str, salt: str | None = None) -> dict[str, Any]:
    """A chat request with an image for each of ``urls``."""
    content: list[Any] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    content.append({"type": "text", "text": "what is it?"})
    body: dict[str, Any] = {"model": "m", "max_tokens": 2,
                            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    return body


async def post(url: str, body: Any, key: str = "key-a") -> tuple[int, Any]:
    """``body`` posted to ``url``'s chat route with ``key``: the status and the answer."""
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session, session.post(
        url + "/v1/chat/completions", json=body, headers=headers
    ) as response:  # fmt: skip
        return response.status, await response.json(content_type=None)

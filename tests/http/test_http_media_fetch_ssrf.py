"""A client's media URL cannot make the proxy read its own network: attacks on the media fetch,
each against real servers on loopback.

Two stand-ins: the *internal* server on 127.0.0.1, which no fetch may reach, counting
every request; and the *public* one on 127.0.0.2, which the tests' limits allow
(``allow_networks``, a lab's option) while 127.0.0.1 stays refused as by default. Names
are answered by a resolver the test controls (behind the proxy's guard, as the system
resolver is in production), so a name may resolve to loopback, or change its answer.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

import aiohttp
import aiohttp.abc
import pytest
from aiohttp import web

from pd_policy import (
    KvConnectorMode,
    MediaFetchFailed,
    MediaFetchRules,
    MediaRefused,
    MediaUnreachable,
    Modality,
    PrefillKv,
    Support,
    WorkerCapability,
)
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.media.fetch import RemoteMedia, fetch_media
from pd_policy_vllm.http.media.guard import MediaLimits, RefusedAddress, media_session
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.identity import WorkerMedia

PUBLIC = "127.0.0.2"  # allowed by the tests' limits: it stands for an Internet host
LIMITS = MediaLimits(allow_networks=[PUBLIC + "/32"], timeout=5)
RULES = MediaFetchRules(max_download_bytes=1000, known=True)

#: A handoff with every field NIXL needs: the proxy takes no less for a stripped leg.
NIXL_HANDOFF: Final = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [0],
                       "remote_host": "127.0.0.1", "remote_port": 1}  # fmt: skip


class Answers(aiohttp.abc.AbstractResolver):
    """A resolver whose answers for each name the test sets: a cycle of address lists
    (one list per lookup), so that an answer may change between lookups."""

    def __init__(self, names: dict[str, list[list[str]]]) -> None:
        self.cycles: dict[str, Iterator[list[str]]] = {
            name: itertools.cycle(answers) for name, answers in names.items()
        }
        self.lookups: list[str] = []

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[aiohttp.abc.ResolveResult]:
        self.lookups.append(host)
        if host not in self.cycles:
            raise OSError(f"no such name: {host}")
        return [
            {"hostname": host, "host": address, "port": port, "family": socket.AF_INET,
             "proto": 0, "flags": socket.AI_NUMERICHOST}
            for address in next(self.cycles[host])
        ]  # fmt: skip

    async def close(self) -> None:
        pass


class Stand:
    """One media server: what it was asked (paths and headers), and its routes; both are
    on one port."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, str]]] = []
        self.port = 0
        self.redirect_to = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.asked.append((request.path, dict(request.headers)))
        path = request.path
        if path == "/img":
            return web.Response(body=b"image bytes", content_type="image/png")
        if path == "/redirect":
            raise web.HTTPFound(self.redirect_to)
        if path.startswith("/chain/"):
            left = int(path.rsplit("/", 1)[1])
            raise web.HTTPFound("/img" if left == 0 else f"/chain/{left - 1}")
        if path == "/big":  # declares more than the cap, and sends nothing
            response = web.StreamResponse(headers={"Content-Length": "100000"})
            await response.prepare(request)
            await asyncio.sleep(30)
            return response
        if path == "/medium":
            return web.Response(body=b"x" * 800)
        if path in ("/big-chunked", "/medium-chunked", "/stall"):
            response = web.StreamResponse()
            response.enable_chunked_encoding()
            await response.prepare(request)
            if path != "/stall":
                for _ in range(40 if path == "/big-chunked" else 8):
                    await response.write(b"x" * 100)
            else:
                await response.write(b"a little")
                await asyncio.sleep(60)
            return response
        if path == "/silent":
            await asyncio.sleep(60)
        return web.Response(status=404)


Test = Callable[[Stand, Stand], Awaitable[None]]


def served(test: Test) -> None:
    """Run ``test(internal, public)`` against both stand-ins, in one event loop, within a
    hang guard."""

    async def main() -> None:
        stands, runners = (Stand(), Stand()), []
        try:
            # One port on both hosts: a connection sent to the wrong address would arrive.
            for stand, host in zip(stands, ("127.0.0.1", PUBLIC), strict=True):
                app = web.Application()
                app.router.add_route("*", "/{tail:.*}", stand.handle)
                runner = web.AppRunner(app, shutdown_timeout=0.1)
                await runner.setup()
                runners.append(runner)
                site = web.TCPSite(runner, host, stands[0].port)
                await site.start()
                stand.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            await asyncio.wait_for(test(*stands), 20)
        finally:
            for runner in runners:
                await runner.cleanup()

    asyncio.run(main())


async def fetch(
    url: str, *, names: Answers | None = None, limits: MediaLimits = LIMITS,
    rules: MediaFetchRules = RULES,
) -> bytes:  # fmt: skip
    async with media_session(limits, resolver=names or Answers({})) as session:
        return await fetch_media(session, url, Modality.IMAGE, rules, param="item", limits=limits)


async def refused(url: str, internal: Stand, **kwargs: Any) -> MediaRefused:
    """The refusal of a fetch of ``url``, which the internal server never saw."""
    with pytest.raises(MediaRefused) as caught:
        await fetch(url, **kwargs)
    assert caught.value.status == 400 and caught.value.param == "item"
    assert "127.0.0" not in caught.value.message and "::" not in caught.value.message
    assert internal.asked == []
    return caught.value


def test_the_public_stand_in_is_fetched_and_the_internal_one_only_in_a_lab() -> None:
    async def test(internal: Stand, public: Stand) -> None:
        assert await fetch(f"http://{PUBLIC}:{public.port}/img") == b"image bytes"
        await refused(f"http://127.0.0.1:{internal.port}/img", internal)
        lab = MediaLimits(allow_private_hosts=True)
        assert await fetch(f"http://127.0.0.1:{internal.port}/img", limits=lab) == b"image bytes"
        assert [path for path, _ in internal.asked] == ["/img"]

    served(test)


@pytest.mark.parametrize(
    "host",
    ["[::1]", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "0.0.0.0", "0", "2130706433",
     "0x7f000001", "0177.0.0.1", "127.1", "169.254.169.254", "[fd00:ec2::254]",
     "[64:ff9b::7f00:1]", "[fe80::1]", "10.0.0.1", "100.64.0.1"],
)  # fmt: skip
def test_a_refused_address_in_any_spelling_is_refused_before_any_connection(host: str) -> None:
    # 0.0.0.0 and its spellings reach 127.0.0.1 on Linux: the internal server would see them.
    async def test(internal: Stand, public: Stand) -> None:
        await refused(f"http://{host}:{internal.port}/img", internal)

    served(test)


@pytest.mark.parametrize(
    "answers",
    [[["127.0.0.1"]], [["169.254.169.254"]], [["0.0.0.0"]], [["10.0.0.1", "127.0.0.1"]]],
)
def test_a_name_that_resolves_to_a_refused_address_is_refused(answers: list[list[str]]) -> None:
    async def test(internal: Stand, public: Stand) -> None:
        names = Answers({"media.test": answers})
        await refused(f"http://media.test:{internal.port}/img", internal, names=names)
        assert names.lookups == ["media.test"]  # the guard saw the answer

    served(test)


def test_localhost_through_the_system_resolver_is_refused() -> None:
    async def test(internal: Stand, public: Stand) -> None:
        url = f"http://localhost:{internal.port}/img"
        async with media_session(LIMITS) as session:
            with pytest.raises(MediaRefused):
                await fetch_media(session, url, Modality.IMAGE, RULES, param="item", limits=LIMITS)
        assert internal.asked == []

    served(test)


def test_of_a_name_with_both_only_its_allowed_address_is_connected_to() -> None:
    async def test(internal: Stand, public: Stand) -> None:
        # The guard drops 127.0.0.1 from the answer: the connection goes to the other.
        names = Answers({"media.test": [["127.0.0.1", PUBLIC]]})
        url = f"http://media.test:{public.port}/img"
        assert await fetch(url, names=names) == b"image bytes"
        assert internal.asked == [] and len(public.asked) == 1

    served(test)


def test_dns_rebinding_the_answer_checked_is_the_one_connected_to() -> None:
    async def test(internal: Stand, public: Stand) -> None:
        # A name whose answer alternates: public to whoever asks first (a check made
        # before the fetch), loopback to the next lookup (the connection's).
        names = Answers({"rebind.test": [[PUBLIC], ["127.0.0.1"]]})
        assert await names.resolve("rebind.test") != []  # the earlier check: public
        await refused(f"http://rebind.test:{internal.port}/img", internal, names=names)
        # And when the fetch's own lookup is the public answer, it reads the public host.
        names = Answers({"rebind.test": [[PUBLIC], ["127.0.0.1"]]})
        assert await fetch(f"http://rebind.test:{public.port}/img", names=names) == b"image bytes"
        assert internal.asked == []

    served(test)


def test_the_session_itself_refuses_a_refused_address_where_it_connects() -> None:
    # The pre-check aside: an IP literal skips aiohttp's resolver, and the socket factory
    # still refuses it.
    async def test(internal: Stand, public: Stand) -> None:
        async with media_session(LIMITS) as session:
            for host in ("127.0.0.1", "[::ffff:127.0.0.1]"):
                with pytest.raises(aiohttp.ClientConnectorError) as caught:
                    await session.get(f"http://{host}:{internal.port}/img")
                assert isinstance(caught.value.os_error, RefusedAddress)
        assert internal.asked == []

    served(test)


@pytest.mark.parametrize("target", ["literal", "name", "other-domain"])
def test_a_redirect_from_an_allowed_host_to_a_refused_one_is_refused(target: str) -> None:
    async def test(internal: Stand, public: Stand) -> None:
        names = Answers({"media.test": [[PUBLIC]], "inside.test": [["127.0.0.1"]],
                         "other.test": [[PUBLIC]]})  # fmt: skip
        public.redirect_to = {
            "literal": f"http://127.0.0.1:{internal.port}/img",
            "name": f"http://inside.test:{internal.port}/img",
            "other-domain": f"http://other.test:{public.port}/img",
        }[target]
        rules = MediaFetchRules(allowed_domains=["media.test", "inside.test"], known=True)
        url = f"http://media.test:{public.port}/redirect"
        await refused(url, internal, names=names, rules=rules)
        assert [path for path, _ in public.asked] == ["/redirect"]  # never /img on other.test

    served(test)


def test_redirects_are_followed_up_to_the_cap_and_no_further() -> None:
    async def test(internal: Stand, public: Stand) -> None:
        base = f"http://{PUBLIC}:{public.port}"
        assert await fetch(base + "/chain/2") == b"image bytes"  # 3 redirects: the cap
        public.asked.clear()
        with pytest.raises(MediaFetchFailed) as caught:
            await fetch(base + "/chain/3")
        assert caught.value.status == 422
        assert len(public.asked) == LIMITS.max_redirects + 1
        with pytest.raises(MediaFetchFailed):
            await fetch(base + "/chain/0", limits=MediaLimits(allow_networks=[PUBLIC + "/32"],
                                                             max_redirects=0))  # fmt: skip

    served(test)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_body_past_the_cap_is_refused(chunked: bool) -> None:
    async def test(internal: Stand, public: Stand) -> None:
        base, tail = f"http://{PUBLIC}:{public.port}", "-chunked" if chunked else ""
        # 800 bytes: under the worker's cap (1000 in RULES), over the proxy's 500 here.
        assert await fetch(f"{base}/medium{tail}") == b"x" * 800
        limits = MediaLimits(allow_networks=[PUBLIC + "/32"], max_bytes=500)
        for path, cap in ((f"/big{tail}", LIMITS), (f"/medium{tail}", limits)):
            with pytest.raises(MediaFetchFailed) as caught:
                await fetch(base + path, limits=cap)
            assert caught.value.status == 422

    served(test)


@pytest.mark.parametrize("path", ["/stall", "/silent"])
def test_a_host_that_stalls_is_cut_at_the_time_limit(path: str) -> None:
    async def test(internal: Stand, public: Stand) -> None:
        # The worker would wait a minute: the proxy's limit cuts it (or the hang guard fails
        # the test).
        limits = MediaLimits(allow_networks=[PUBLIC + "/32"], timeout=0.3)
        rules = MediaFetchRules(timeouts={Modality.IMAGE: 60}, known=True)
        with pytest.raises(MediaUnreachable) as caught:
            await fetch(f"http://{PUBLIC}:{public.port}{path}", limits=limits, rules=rules)
        assert caught.value.status == 504 and caught.value.retryable

    served(test)


def test_a_fetch_sends_no_header_of_the_proxys() -> None:
    async def test(internal: Stand, public: Stand) -> None:
        await fetch(f"http://{PUBLIC}:{public.port}/img")
        (_, headers), = public.asked  # fmt: skip
        assert "Authorization" not in headers and "Cookie" not in headers
        assert headers["Accept-Encoding"] == "identity"

    served(test)


def test_through_the_proxy_the_media_host_never_gets_the_workers_key() -> None:
    key = "sk-worker-0123456789"

    async def test(internal: Stand, public: Stand) -> None:
        legs: list[dict[str, str]] = []

        async def prefill(request: web.Request) -> web.Response:
            legs.append(dict(request.headers))
            return web.json_response({"prompt_token_ids": [1], "kv_transfer_params": NIXL_HANDOFF})

        async def decode(request: web.Request) -> web.Response:
            return web.json_response({"choices": []})

        runners, urls = [], []
        for handler in (prefill, decode):
            app = web.Application()
            app.router.add_post("/v1/chat/completions", handler)
            runner = web.AppRunner(app)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            urls.append(f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}")  # type: ignore[union-attr]
        rules = MediaFetchRules(known=True)
        proxy = Proxy(
            HttpWorker(urls[0], kv=PrefillKv(KvConnectorMode.NIXL), media=WorkerMedia(rules)),
            [HttpWorker(urls[1], WorkerCapability(Support.FALSE))],
            mrope=False, remote_media=RemoteMedia.FETCH, keys=Keys(worker=key),
            media_limits=LIMITS, log_requests=False,
        )  # fmt: skip
        runner = web.AppRunner(proxy.app())
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        front = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        try:
            answers = []
            async with aiohttp.ClientSession() as client:
                for media in (f"http://{PUBLIC}:{public.port}/img",
                              f"http://127.0.0.1:{internal.port}/img"):  # fmt: skip
                    part = {"type": "image_url", "image_url": {"url": media}}
                    body = {"model": "m", "max_tokens": 1,
                            "messages": [{"role": "user", "content": [part]}]}  # fmt: skip
                    async with client.post(front + "/v1/chat/completions", json=body) as answer:
                        answers.append((answer.status, await answer.text()))
        finally:
            for runner in runners:
                await runner.cleanup()
        assert answers[0][0] == 200
        assert legs[0]["Authorization"] == f"Bearer {key}"  # the workers get it
        (_, headers), = public.asked  # fmt: skip
        assert all(key not in value for value in headers.values())
        assert "Authorization" not in headers
        status, text = answers[1]
        assert status == 400 and "pd_media_refused" in text and "127.0.0" not in text
        assert internal.asked == [] and len(legs) == 1

    served(test)

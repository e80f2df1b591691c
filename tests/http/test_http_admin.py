"""The admin routes as a hostile client would try them: an API client's key (or none, or a
wrong one) never admits ``/admin/*`` and the worker it names is never called; an admin key
admits no ``/v1`` route; ``--admin-allowed-hosts`` is decided on the host ``aiohttp``
would connect to, whatever the URL's userinfo, fragment or number form; every change is
one audit line that names no key; and ``--admin`` without an admin key does not start.
(The keys themselves are in ``test_http_admin_keys.py``, the host decision alone in
``test_http_allowed_hosts.py``.)"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from fleet_stands import Stand, serving, stands

from pd_policy import (
    KvConnectorMode,
    MediaFetchRules,
    PrefillKv,
    Support,
    WorkerCapability,
)
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.auth import Keys, key_id
from pd_policy_vllm.http.cli import main
from pd_policy_vllm.http.fleet.allowed_hosts import allowed_hosts
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.identity import WorkerMedia

WORKER, CLIENT, ADMIN = "worker-K3Y", "client-K3Y", "admin-K3Y"
KEYS = Keys(WORKER, (CLIENT,), (ADMIN,))
ROUTE = "/admin/workers"


def bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


class Recorded:
    """A stand-in worker that records every request it is sent, on any route."""

    def __init__(self) -> None:
        self.stand = Stand("new")
        self.seen: list[tuple[str, str | None]] = []

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        app = self.stand.app()

        @aiohttp.web.middleware
        async def record(request: aiohttp.web.Request, handler: Any) -> Any:
            self.seen.append((request.path, request.headers.get("Authorization")))
            return await handler(request)

        app.middlewares.append(record)
        async with serving(app) as url:
            yield url


Test = Callable[[str, str, Recorded, Proxy], Awaitable[None]]


def run(test: Test, **kwargs: Any) -> None:
    async def go() -> None:
        def make(fleet: Fleet) -> Proxy:
            return Proxy(fleet=fleet, mrope=False, keys=KEYS, admin=True, **kwargs)

        recorded = Recorded()
        async with recorded.serving() as worker, stands(1, 1, make) as (url, _, _, proxy):
            await test(url, worker, recorded, proxy)

    asyncio.run(go())


async def call(method: str, url: str, key: str | None, body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.request(
        method, url, json=body, headers=bearer(key)
    ) as response:  # fmt: skip
        return response.status, await response.json(content_type=None)


def test_no_key_but_an_admins_admits_the_admin_routes_and_the_named_worker_is_never_called() -> (
    None
):
    async def test(url: str, worker: str, recorded: Recorded, proxy: Proxy) -> None:
        members = len(list(proxy.fleet))
        add = {"role": "decode", "url": worker}
        for key in (CLIENT, None, "wrong", f"{ADMIN}x", ADMIN[:-1], WORKER):
            for method, body in (("POST", add), ("GET", None), ("DELETE", {"url": worker})):
                status, answer = await call(method, url + ROUTE, key, body)
                assert status == 403, (key, method)
                assert answer["error"]["code"] == "pd_forbidden"
                assert answer["error"]["type"] == "forbidden"
                assert "K3Y" not in str(answer)
        assert recorded.seen == []  # not /server_info, not a probe: nothing at all
        assert len(list(proxy.fleet)) == members
        status, answer = await call("POST", url + ROUTE, ADMIN, add)
        assert status == 201 and answer["name"] == worker
        # The admin's worker is called, and only it carries the workers' key.
        assert recorded.seen and all(auth == f"Bearer {WORKER}" for _, auth in recorded.seen)

    run(test)


def test_an_admin_key_admits_no_api_route_unless_it_is_also_a_clients() -> None:
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    async def test(url: str, worker: str, recorded: Recorded, proxy: Proxy) -> None:
        status, answer = await call("POST", f"{url}/v1/chat/completions", ADMIN, chat)
        assert status == 401 and answer["error"]["code"] == "pd_unauthorized"
        assert (await call("GET", f"{url}/v1/models", ADMIN))[0] == 401
        assert (await call("POST", f"{url}/v1/chat/completions", CLIENT, chat))[0] == 200

    run(test)

    async def both(url: str, worker: str, recorded: Recorded, proxy: Proxy) -> None:
        assert (await call("POST", f"{url}/v1/chat/completions", ADMIN, chat))[0] == 200
        assert (await call("GET", url + ROUTE, ADMIN))[0] == 200

    async def go() -> None:
        keys = Keys(WORKER, (CLIENT, ADMIN), (ADMIN,))
        async with stands(1, 1, lambda f: Proxy(fleet=f, mrope=False, keys=keys, admin=True)) as (
            url, _, _, proxy,
        ):  # fmt: skip
            await both(url, "", Recorded(), proxy)

    asyncio.run(go())


def test_serving_the_admin_routes_without_an_admin_key_is_refused() -> None:
    with pytest.raises(ValueError, match="admin key"):
        Proxy(fleet=Fleet(), mrope=False, keys=Keys(WORKER, (CLIENT,)), admin=True)


ATTACKS = [
    "http://10.0.0.1@{local}/",  # userinfo naming an allowed address
    "http://workers.internal@{local}/",
    "http://workers.internal:80@{local}/",
    "http://{local}#@workers.internal",  # a fragment that reads as userinfo
    "http://{local}/#@10.0.0.1",
    "http://{local}?@workers.internal",
    "http://2130706433:{port}/",  # 127.0.0.1, as the C resolver reads a number
    "http://0177.0.0.1:{port}/",  # octal
    "http://0x7f.0.0.1:{port}/",  # hex
    "http://0x7f000001:{port}/",
    "http://127.1:{port}/",  # a short form
    "http://[::ffff:127.0.0.1]:{port}/",  # a mapped address outside fd00::/8
    "http://workers.internal.{local}/",
    "http://localhost:{port}/",
    "ftp://workers.internal/",
    "workers.internal",
    "http:///workers.internal",
    "http://workers.internal\\@{local}/",
]


@pytest.mark.parametrize("attack", ATTACKS)
def test_a_host_the_allowed_hosts_do_not_list_is_refused_and_never_called(attack: str) -> None:
    async def test(url: str, worker: str, recorded: Recorded, proxy: Proxy) -> None:
        local = worker.removeprefix("http://")
        named = attack.format(local=local, port=local.rsplit(":", 1)[1])
        status, answer = await call("POST", url + ROUTE, ADMIN, {"role": "decode", "url": named})
        assert status == 403 and answer["error"]["code"] == "pd_forbidden"
        assert answer["error"]["param"] == "url"
        assert recorded.seen == []

    run(test, admin_hosts=allowed_hosts(["workers.internal, 10.0.0.0/8", "[fd00::]/8"]))


def test_a_host_the_allowed_hosts_list_is_added() -> None:
    async def test(url: str, worker: str, recorded: Recorded, proxy: Proxy) -> None:
        status, _ = await call("POST", url + ROUTE, ADMIN, {"role": "decode", "url": worker})
        assert status == 201 and recorded.seen

    run(test, admin_hosts=allowed_hosts(["10.0.0.0/8", "127.0.0.0/8"]))


def test_every_admin_change_is_one_audit_line_naming_no_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)

    async def test(url: str, worker: str, recorded: Recorded, proxy: Proxy) -> None:
        with_creds = worker.replace("http://", "http://op:PASSW0RD@")
        add = {"role": "decode", "url": with_creds}
        assert (await call("POST", url + ROUTE, CLIENT, add))[0] == 403
        assert (await call("POST", url + ROUTE, ADMIN, add))[0] == 201
        assert (await call("DELETE", url + ROUTE, ADMIN, {"url": with_creds}))[0] == 202
        assert (await call("DELETE", url + ROUTE, ADMIN, {"url": "http://gone:1"}))[0] == 400
        forged = {"role": ["decode"], "url": "http://a\u2028admin add outcome=added:1"}
        assert (await call("POST", url + ROUTE, ADMIN, forged))[0] == 400

    run(test)
    records = [r for r in caplog.records if r.name == "pd_policy_vllm.http.admin"]
    audit = [r.getMessage() for r in records]
    assert len(audit) == 5, audit
    refused, added, drained, missing, forged = audit
    # A refusal is a warning, a change done is information.
    assert [r.levelname for r in records] == ["WARNING", "INFO", "INFO", "WARNING", "WARNING"]
    who = f"by=key:{key_id(ADMIN)}"
    assert refused.startswith("admin add role=- worker=- by=not-an-admin outcome=pd_forbidden")
    assert added.startswith("admin add role=decode worker=http://127.0.0.1:")
    assert added.endswith(f"{who} outcome=added")
    assert drained.startswith("admin drain role=decode worker=http://127.0.0.1:")
    assert drained.endswith(f"{who} outcome=draining")
    assert missing == f"admin drain role=- worker=http://gone:1 {who} outcome=pd_invalid_request"
    # What a caller sends cannot write another line, nor another entry into this one.
    assert forged == f"admin add role=- worker=- {who} outcome=pd_invalid_request"
    everything = [r.getMessage() for r in caplog.records] + [str(r.args) for r in caplog.records]
    for secret in ("K3Y", "PASSW0RD", ADMIN[:8], CLIENT[:8]):
        assert not [line for line in everything if secret in line], secret


def test_a_workers_redirect_is_not_followed_so_its_target_never_sees_the_workers_key() -> None:
    async def test(url: str, worker: str, recorded: Recorded, proxy: Proxy) -> None:
        async def away(request: aiohttp.web.Request) -> aiohttp.web.Response:
            raise aiohttp.web.HTTPFound(worker + request.path_qs)

        redirecting = aiohttp.web.Application()
        redirecting.router.add_route("*", "/{tail:.*}", away)
        async with serving(redirecting) as there:
            status, _ = await call("POST", url + ROUTE, ADMIN, {"role": "decode", "url": there})
        assert status == 201  # a worker that does not describe itself, as the flags say
        assert recorded.seen == []

    run(test)


def test_a_media_url_from_a_clients_body_is_fetched_without_the_workers_key() -> None:
    async def go() -> None:
        media, prefill, decode = Recorded(), Stand("p", lm_only=False), Stand("d")
        async with media.serving() as media_url, serving(prefill.app()) as p_url, serving(
            decode.app()
        ) as d_url:  # fmt: skip
            rules = MediaFetchRules(allowed_domains=["127.0.0.1"], known=True)
            proxy = Proxy(
                HttpWorker(p_url, kv=PrefillKv(KvConnectorMode.NIXL), media=WorkerMedia(rules)),
                [HttpWorker(d_url, WorkerCapability(Support.FALSE))],
                mrope=False, remote_media=RemoteMedia.FETCH, keys=KEYS,
                media_limits=MediaLimits(allow_private_hosts=True),  # the media host is local
            )  # fmt: skip
            part = {"type": "image_url", "image_url": {"url": media_url + "/a.png"}}
            chat = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": [
                part, {"type": "text", "text": "?"}]}]}  # fmt: skip
            async with serving(proxy.app()) as url:
                await call("POST", f"{url}/v1/chat/completions", CLIENT, chat)
        # Fetched (the media host is the workers' allowed one), and without any key.
        assert media.seen == [("/a.png", None)]

    asyncio.run(go())


def test_admin_without_an_admin_key_does_not_start(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PD_POLICY_ADMIN_API_KEYS", raising=False)
    monkeypatch.setenv("PD_POLICY_API_KEYS", CLIENT)
    workers = ["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9"]
    # No worker listens: refused for its admin key before any is called, or the line is
    # another (the worker unreachable).
    argv = [*workers, "--startup-timeout", "0", "--admin"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("pd-policy-proxy: --admin needs an admin key")
    assert CLIENT not in err
    for bad in (["--admin", "--admin-api-key", "k", "--admin-allowed-hosts", "a_b"],
                ["--admin-allowed-hosts", "10.0.0.0/8"]):  # fmt: skip
        assert main([*workers, "--startup-timeout", "0", *bad]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--admin-allowed-hosts" in err

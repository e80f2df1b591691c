"""The proxy keeps an IPv6 worker address whole at every place it builds a URL or a host:
the worker's URL, the Mooncake bootstrap host, a member's name, the upstream client's
connection and ``Host`` header, the listen address; and it calls a worker on ``[::1]``."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fleet_stands import Stand

from pd_policy import InvalidConfiguration, KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.flags import parser
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.describe import _host as describe_host
from pd_policy_vllm.http.fleet.members import Fleet, member_name
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.upstream.client import Upstream
from pd_policy_vllm.http.upstream.target import Target
from pd_policy_vllm.openai.workers import prefill_kv_from_config

MOONCAKE = {"kv_transfer_config": {"kv_connector": "MooncakeConnector", "engine_id": "e"}}


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("fe80::1", "http://[fe80::1]"),
        ("[fe80::1]:8000", "http://[fe80::1]:8000"),
        ("fe80::1%eth0", "http://[fe80::1%25eth0]"),
        ("http://[::1]:8000/", "http://[::1]:8000"),
    ],
)
def test_a_workers_url_keeps_the_address_whole(given: str, url: str) -> None:
    assert HttpWorker(given).url == url


def test_a_workers_url_that_reads_two_ways_is_refused() -> None:
    with pytest.raises(InvalidConfiguration):
        HttpWorker("http://fe80::1:8000")


@pytest.mark.parametrize(
    ("url", "host", "addr"),
    [
        ("[fe80::1]:8000", "fe80::1", "http://[fe80::1]:8998"),
        ("fe80::1%eth0", "fe80::1%eth0", "http://[fe80::1%25eth0]:8998"),
        ("http://10.0.0.1:8000", "10.0.0.1", "http://10.0.0.1:8998"),
    ],
)
def test_the_bootstrap_host_is_the_whole_address(url: str, host: str, addr: str) -> None:
    kv = prefill_kv_from_config(MOONCAKE, HttpWorker(url).url)
    assert (kv.bootstrap_host, kv.bootstrap_addr) == (host, addr)
    assert describe_host(HttpWorker(url).url) == host
    assert kv.mode is KvConnectorMode.MOONCAKE


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("http://u:secret@[fe80::1%25eth0]:8000/v1", "http://[fe80::1%25eth0]:8000"),
        ("http://[::1]", "http://[::1]"),
    ],
)
def test_a_members_name_keeps_the_address_whole(url: str, name: str) -> None:
    assert member_name(url) == name


def test_the_upstream_client_connects_to_the_bare_address_and_names_it_in_brackets() -> None:
    target = Target("http://[fe80::1%25eth0]:8000/v1/chat/completions")
    assert (target.host, target.port) == ("fe80::1%eth0", 8000)  # as a socket takes it
    assert b"Host: [fe80::1%25eth0]:8000\r\n" in target.prefix


def test_the_listen_address_binds_an_ipv6_host_bare() -> None:
    args = parser().parse_args(["--prefill", "p:1", "--decode", "d:2", "--host", "[::1]"])
    assert args.host == "::1"


def _loopback_v6() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


# This machine has IPv6 loopback (checked here): the test connects for real. Where it has
# none, the building above is what is tested; the test says so instead of passing.
HAS_V6 = _loopback_v6()


async def _serve(app: web.Application, host: str) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


def test_the_proxy_calls_workers_on_ipv6_loopback_given_as_bare_addresses() -> None:
    assert HAS_V6, "no IPv6 loopback on this machine: only the URL building is tested"
    seen: list[tuple[str, str]] = []

    async def worker(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append((request.host, "prefill" if body.get("max_tokens") == 1 else "decode"))
        if body.get("max_tokens") == 1:
            return web.json_response({"prompt_token_ids": [1, 2, 3], "kv_transfer_params":
                                      {"do_remote_prefill": True, "transfer_id": "t"}})  # fmt: skip
        return web.json_response({"object": "chat.completion", "choices": []})

    async def main() -> None:
        runners = []
        upstream = Upstream()
        try:
            ports = []
            for _ in ("prefill", "decode"):
                app = web.Application()
                app.router.add_post("/v1/chat/completions", worker)
                runner, port = await _serve(app, "::1")
                runners.append(runner)
                ports.append(port)
            # The client alone, then the proxy over workers named "[::1]:port".
            url = f"http://[::1]:{ports[0]}/v1/chat/completions"
            async with upstream.post(url, b'{"max_tokens": 1}', {}) as r:
                assert r.status == 200 and b"prompt_token_ids" in await r.read()
            proxy = Proxy(
                HttpWorker(f"[::1]:{ports[0]}", kv=PrefillKv(KvConnectorMode.TRANSFER)),
                [HttpWorker(f"[::1]:{ports[1]}", WorkerCapability(Support.FALSE))],
                mrope=False,
            )
            proxy_runner, proxy_port = await _serve(proxy.app(), "::1")
            runners.append(proxy_runner)
            body: dict[str, Any] = {
                "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
            }  # fmt: skip
            async with (
                aiohttp.ClientSession() as session,
                session.post(f"http://[::1]:{proxy_port}/v1/chat/completions", json=body) as r,
            ):
                assert r.status == 200, await r.text()
        finally:
            upstream.close()
            for runner in reversed(runners):
                await runner.cleanup()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert [role for _, role in seen] == ["prefill", "prefill", "decode"]
    assert all(host == f"[::1]:{host.rsplit(':', 1)[1]}" for host, _ in seen)


def test_the_fleet_finds_a_member_by_its_bare_address_and_not_by_a_broken_one() -> None:
    fleet = Fleet()
    fleet.add("decode", HttpWorker("http://[::1]:8000/", WorkerCapability(Support.FALSE)))
    member = fleet.find("[::1]:8000")
    assert member is not None and member.name == "http://[::1]:8000"
    assert fleet.find("::1") is None  # another port
    assert fleet.find("http://::1:8000") is None  # read two ways: no member has it


def test_a_worker_described_at_a_bare_ipv6_address_is_called_there() -> None:
    assert HAS_V6, "no IPv6 loopback on this machine: only the URL building is tested"
    stand = Stand("p", connector="MooncakeConnector")

    async def main() -> HttpWorker:
        runner, port = await _serve(stand.app(), "::1")
        try:
            async with aiohttp.ClientSession() as session:
                return await describe(session, f"[::1]:{port}", "prefill", OperatorSays())
        finally:
            await runner.cleanup()

    worker = asyncio.run(asyncio.wait_for(main(), 30))
    assert worker.url.startswith("http://[::1]:")
    assert (worker.kv.mode, worker.kv.bootstrap_host) == (KvConnectorMode.MOONCAKE, "::1")
    assert worker.kv.bootstrap_addr == "http://[::1]:8998"

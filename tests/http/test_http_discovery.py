"""Workers found in DNS, against a real DNS server on 127.0.0.1 (``dns_server``): A/AAAA
and SRV names read as workers, a worker that appears described and probed before it
takes traffic, one that leaves drained (its request in flight finishing), a failing
resolution that keeps the fleet, and the ``[[discover]]`` tables' errors."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from dns_server import Records, dns_server
from fleet_stands import Stand, serving
from test_http_fleet import chat, post

from pd_policy import Health
from pd_policy_vllm.http.cli import configuration, discovery_of, probe_of, read_fleet
from pd_policy_vllm.http.config import ConfigError
from pd_policy_vllm.http.fleet.describe import OperatorSays
from pd_policy_vllm.http.fleet.discovery import (
    MAX_FOUND,
    DnsSource,
    discovering,
    found_urls,
    resolver_for,
)
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.reload import reload
from pd_policy_vllm.openai.workers import HttpWorker


def test_a_and_aaaa_records_are_workers_on_the_port_srv_records_at_theirs() -> None:
    srv = {"prefill.test.": [("p0.test.", 8001), ("127.0.0.3.", 8002)]}
    records = Records(a={"decode.test.": ["127.0.0.2", "::1"]}, srv=srv)

    async def main() -> None:
        with dns_server(records) as where:
            resolver = resolver_for(where)
            a = await found_urls(DnsSource("decode", "decode.test.", 8000), resolver)
            assert a == {"http://127.0.0.2:8000", "http://[::1]:8000"}
            srv = await found_urls(DnsSource("prefill", "prefill.test.", None), resolver)
            assert srv == {"http://p0.test:8001", "http://127.0.0.3:8002"}
            records.a["decode.test."] = []  # an answer with no record: no worker
            assert await found_urls(DnsSource("decode", "decode.test.", 8000), resolver) == set()

    asyncio.run(main())


def _toml(prefill: str, dns: str, interval: float = 0.2) -> str:
    return (
        f'mrope = false\ndns_server = "{dns}"\nprobe_interval = 0.1\n\n'
        f'[[workers]]\nurl = "{prefill}"\nrole = "prefill"\nkv_mode = "nixl"\n\n'
        f'[[discover]]\nrole = "decode"\nname = "decodes.test."\nsrv = true\n'
        f'interval = {interval}\ncapability = "lm-only"\n'
    )


def _srv(stand: Stand) -> tuple[str, int]:
    host, port = stand.url.removeprefix("http://").rsplit(":", 1)
    return f"{host}.", int(port)


async def _until(check: Any, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _served(stack: contextlib.AsyncExitStack, stands: tuple[Stand, ...],
                  records: Records) -> str:  # fmt: skip
    # Each stand served (its URL set) and a DNS server of ``records``: where it answers.
    for stand in stands:
        stand.url = await stack.enter_async_context(serving(stand.app()))
    return stack.enter_context(dns_server(records))


def test_workers_join_and_leave_as_dns_says_and_a_failing_dns_changes_nothing(
    tmp_path: Path,
) -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    first, second = Stand("first", describes=False), Stand("second", describes=False)
    records = Records()

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            where = await _served(stack, (prefill, first, second), records)
            records.srv["decodes.test."] = [_srv(first)]
            path = tmp_path / "proxy.toml"
            path.write_text(_toml(prefill.url, where))
            args, _ = configuration(["--config", str(path)], {})
            fleet = await read_fleet(args)
            proxy = Proxy(fleet=fleet, mrope=False, probe=probe_of(args),
                          discovery=discovery_of(args))  # fmt: skip
            url = await stack.enter_async_context(serving(proxy.app()))

            def routable(stand: Stand) -> bool:
                member = fleet.find(stand.url)
                return member is not None and member.health.health is Health.HEALTHY

            await _until(lambda: routable(first), "the first decode never joined")
            status, answer, _ = await post(url, chat(1))
            assert status == 200 and len(first.calls) == 1, answer
            # A second one appears: described, probed, then serving.
            records.srv["decodes.test."] = [_srv(first), _srv(second)]
            await _until(lambda: routable(second), "the second decode never joined")
            # An answer no worker could be at is passed over, and the rest still read.
            records.srv["decodes.test."] = [_srv(first), _srv(second), ("bad host.", 1)]
            await asyncio.sleep(0.6)
            assert routable(first) and routable(second)
            records.srv["decodes.test."] = [_srv(first), _srv(second)]
            # DNS in trouble: the fleet stays as the last answer had it.
            records.failing = True
            await asyncio.sleep(0.6)
            assert routable(first) and routable(second)
            records.failing = False
            # The first leaves DNS while a request runs on it: drained, not cut.
            first.delay = 1.5
            before = len(first.calls)
            slow = asyncio.create_task(post(url, chat(2)))
            await _until(lambda: len(first.calls) > before or len(second.calls) > 0, "no leg")
            records.srv["decodes.test."] = [_srv(second)]
            await _until(lambda: not routable(first), "the first decode was never drained")
            assert (await slow)[0] == 200
            served = len(first.calls)
            answers = await asyncio.gather(*(post(url, chat(i)) for i in range(6)))
            assert [a[0] for a in answers] == [200] * 6 and len(first.calls) == served

    asyncio.run(main())


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('role = "decode"\nsrv = true\n', "discover[0]: name: a DNS name is needed"),
        ('role = "decode"\nname = "d."\n', "discover[0]: port: give a port for A/AAAA"),
        ('role = "decode"\nname = "d."\nport = 80\nsrv = true\n', "port: give a port"),
        ('role = "decode"\nname = "d."\nport = 0\n', "discover[0]: port: 0 is not a port"),
        ('role = "decode"\nname = "d."\nsrv = true\ninterval = 0\n', "interval: 0 is not"),
        ('role = "decode"\nname = "d."\nsrv = true\nurl = "http://x"\n', "url: no such key"),
        ('role = "dec"\nname = "d."\nsrv = true\n', "role: 'dec' is not one of"),
    ],
)
def test_a_bad_discover_table_is_one_line_naming_the_key(
    tmp_path: Path, table: str, message: str
) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text('[[workers]]\nurl = "http://p"\nrole = "prefill"\n\n[[discover]]\n' + table)
    with pytest.raises(ConfigError) as caught:
        configuration(["--config", str(path)], {})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_role_dns_gives_needs_no_flag_and_its_decodes_need_the_mrope_flag(
    tmp_path: Path,
) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(_toml("http://p:1", "127.0.0.1:53").replace("mrope = false\n", ""))
    args, _ = configuration(["--config", str(path)], {})  # no decode listed: DNS gives them
    assert [s.role for s in discovery_of(args).sources] == ["decode"]  # type: ignore[union-attr]


def test_a_name_that_answers_too_many_gives_at_most_the_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A DNS server gone wrong (or hostile) lists far more workers than a fleet has: the
    # proxy tries at most MAX_FOUND of them, in a stable order, and says so.
    targets = [("127.0.0.1.", port) for port in range(1, MAX_FOUND + 45)]  # nothing listens
    records = Records(srv={"many.test.": targets})
    tried: list[str] = []

    async def described(url: str, role: str, says: OperatorSays) -> HttpWorker:
        tried.append(url)
        raise aiohttp.ClientConnectionError("nothing listens there")

    async def main() -> None:
        with dns_server(records) as where:
            source = DnsSource("decode", "many.test.", None, interval=60)
            fleet = Fleet()
            async with discovering(fleet, [source], resolver_for(where), described):
                await _until(lambda: len(tried) >= MAX_FOUND, "the answers were not tried")
                await asyncio.sleep(0.2)
        assert len(tried) == MAX_FOUND == len(set(tried)) and list(fleet) == []

    with caplog.at_level("WARNING", logger="pd_policy_vllm.http.discovery"):
        asyncio.run(main())
    assert any(f"the first {MAX_FOUND} taken" in r.getMessage() for r in caplog.records)


def test_a_reload_follows_the_files_names_now_and_keeps_what_a_kept_name_found(
    tmp_path: Path,
) -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    first, second = Stand("first", describes=False), Stand("second", describes=False)
    records = Records()
    more = '\n[[discover]]\nrole = "decode"\nname = "more.test."\nsrv = true\ninterval = 0.2\n'

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            where = await _served(stack, (prefill, first, second), records)
            records.srv["decodes.test."] = [_srv(first)]
            records.srv["more.test."] = [_srv(second)]
            path = tmp_path / "proxy.toml"
            path.write_text(_toml(prefill.url, where))
            argv = ["--config", str(path)]
            args, _ = configuration(argv, {})
            fleet, probe = await read_fleet(args), probe_of(args)
            proxy = Proxy(fleet=fleet, mrope=False, probe=probe, discovery=discovery_of(args))
            await stack.enter_async_context(serving(proxy.app()))

            def routable(stand: Stand) -> bool:
                member = fleet.find(stand.url)
                return member is not None and member.health.health is Health.HEALTHY

            await _until(lambda: routable(first), "the first decode never joined")
            first_key = ("decode", fleet.find(first.url).name)  # type: ignore[union-attr]
            # A name added: followed; the kept one's worker is not the file's to drain.
            path.write_text(_toml(prefill.url, where) + more)
            args, done = await reload(proxy, args, argv, {}, stated=probe.stated)
            assert done.drained == () and done.added == ()
            await _until(lambda: routable(second), "the new name's decode never joined")
            await asyncio.sleep(0.5)
            assert routable(first) and probe.stated[first_key].capability is not None
            assert probe.stated[first_key] == discovery_of(args).sources[0].says  # type: ignore[union-attr]
            # A name removed: its workers drain; the other's stay.
            path.write_text(_toml(prefill.url, where).split("[[discover]]")[0] + more)
            args, done = await reload(proxy, args, argv, {}, stated=probe.stated)
            await _until(lambda: not routable(first), "the removed name's decode kept serving")
            assert fleet.find(first.url).health.health is Health.DRAINING  # type: ignore[union-attr]
            assert routable(second) and first_key not in probe.stated
            assert [s.name for s in proxy.discovery.sources] == ["more.test."]  # type: ignore[union-attr]

    asyncio.run(main())

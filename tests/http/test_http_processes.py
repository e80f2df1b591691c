"""``--processes 2`` against a real ``pd-policy-proxy`` process: two children on one port
(port 0 included), a child killed and restarted while requests keep being served, every
child drained on SIGTERM; a reload that reaches every child, and a restarted child that
runs it; every child reading the prefills' KV events and routing by them; and the
combination it refuses (``--admin``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from fleet_stands import Stand, serving
from proxy_process import proxy_command, started
from test_http_fleet import chat
from test_http_kv_routing import chat as kv_chat
from test_http_lifecycle import _flags, _post, proxy_process

from kv_stub import StubConfig, kv_stubs
from pd_policy_vllm.http.cli import main


def _children(pid: int) -> set[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return {int(child) for child in text.split()}


async def two_children(pid: int, deadline: float) -> set[int]:
    """The two children of the proxy ``pid``, once it has started both; fails past
    ``deadline`` (``time.monotonic``)."""
    while len(children := _children(pid)) < 2:
        assert time.monotonic() < deadline, f"the proxy {pid} has {len(children)} children"
        await asyncio.sleep(0.1)
    return children


def test_two_processes_share_a_port_and_a_killed_one_is_restarted() -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d")

    async def main_() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d = await stack.enter_async_context(serving(decode.app()))
            flags = _flags(p, d, "--processes", "2", "--pre-stop-seconds", "0")
            url, process = await stack.enter_async_context(proxy_process(*flags))
            deadline = time.monotonic() + 30
            first = await two_children(process.pid, deadline)
            statuses = await asyncio.gather(*(_post(url, chat(i)) for i in range(8)))
            assert statuses == [200] * 8
            # Each original child killed in turn: the port serves throughout, whichever
            # child holds it now.
            for killed in sorted(first):
                before = _children(process.pid)
                os.kill(killed, signal.SIGKILL)
                while not ((now := _children(process.pid)) - before and len(now) == 2):
                    assert time.monotonic() < deadline + 60, "the child was not restarted"
                    await asyncio.sleep(0.1)
                statuses = await asyncio.gather(*(_post(url, chat(i)) for i in range(8)))
                assert statuses == [200] * 8
            assert not now & first
            process.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(process.wait, 30) == 0
            assert not any(Path(f"/proc/{child}").exists() for child in now)

    asyncio.run(main_())


def test_admin_with_several_processes_is_refused_with_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["--prefill", "http://p:1", "--decode", "http://d:1", "--no-mrope",
                 "--admin", "--admin-api-key", "k", "--processes", "2"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--admin with --processes above 1" in err


def test_a_reload_reaches_every_process_and_a_restarted_one_runs_it(tmp_path: Path) -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    old, new = Stand("old", describes=False), Stand("new", describes=False)
    config, p = tmp_path / "proxy.toml", ""

    def write(decode: str) -> None:
        config.write_text(
            f"mrope = false\nconfig_watch_seconds = 0\nprobe_interval = 0.2\n\n"
            f'[[workers]]\nurl = "{p}"\nrole = "prefill"\nkv_mode = "nixl"\n\n'
            f'[[workers]]\nurl = "{decode}"\nrole = "decode"\ncapability = "lm-only"\n'
        )

    async def main_() -> None:
        nonlocal p
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d1 = await stack.enter_async_context(serving(old.app()))
            d2 = await stack.enter_async_context(serving(new.app()))
            write(d1)
            flags = ("--config", str(config), "--processes", "2", "--pre-stop-seconds", "0")
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            url, process, log = running.url, running.process, running.log
            deadline = time.monotonic() + 60
            await two_children(process.pid, deadline)
            write(d2)
            process.send_signal(signal.SIGHUP)  # to the parent: it tells every child
            while sum("SIGHUP: reloaded" in x for x in log) < 2:
                assert time.monotonic() < deadline, "not every process reloaded"
                await asyncio.sleep(0.1)
            # One child killed: its successor is made from the start's configuration, and
            # reads the one its sibling runs now before anything else.
            before = _children(process.pid)
            os.kill(min(before), signal.SIGKILL)
            while not any("restarted: reloaded" in x for x in log):
                assert time.monotonic() < deadline, "the restarted child did not reload"
                await asyncio.sleep(0.1)
            served = len(old.calls)
            # Each request on a connection of its own: the kernel spreads them over both.
            while len(new.calls) < 24:
                assert time.monotonic() < deadline, "the new decode never served"
                statuses = await asyncio.gather(*(_post(url, chat(i)) for i in range(8)))
                assert set(statuses) <= {200, 503}
            assert len(old.calls) == served  # no process routes to the decode dropped

    asyncio.run(main_())


KV_CONFIG = StubConfig(block_size=16, capacity=256, image_tokens=40)


def test_each_process_follows_the_kv_events_and_routes_by_them() -> None:
    # Round robin over two prefills, in each process: a follow-up lands on the prefill
    # that served its first turn only where that process reads the prefills' KV events.
    async def main_() -> None:
        async with contextlib.AsyncExitStack() as stack:
            stubs = await stack.enter_async_context(kv_stubs(2, 1, KV_CONFIG))
            flags = [a for p in stubs.prefills for a in ("--prefill", p.url)]
            flags += ["--decode", stubs.decodes[0].url, "--kv-routing", "--no-mrope",
                      "--balance", "round_robin", "--processes", "2"]  # fmt: skip
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            url, process = running.url, running.process
            deadline = time.monotonic() + 60
            while len(_children(process.pid)) < 2 or not await _synced(url):
                assert time.monotonic() < deadline, "the processes never synced their feeds"
                await asyncio.sleep(0.2)
            firsts = []
            for i in range(8):  # each turn on a connection of its own: either process
                image = bytes([65 + i]) * 90
                for stub in stubs.prefills:
                    stub.records.clear()
                assert await _post(url, _turn(i, image)) == 200
                (first,) = [s.name for s in stubs.prefills if s.records]
                await asyncio.sleep(0.3)  # its blocks' events reach both processes
                assert await _post(url, _turn(i, image, "and more")) == 200
                then = [s.name for s in stubs.prefills if len(s.records) == (s.name == first) + 1]
                assert then == [first], f"turn {i}: first on {first}, then on {then}"
                firsts.append(first)
            assert set(firsts) == {"p0", "p1"}  # round robin alone would have moved them

    asyncio.run(main_())


def _turn(i: int, image: bytes, *more: str) -> dict[str, object]:
    # A system prompt of its own: no two conversations share a block.
    body = kv_chat(f"topic {i}", *more, image=image)
    body["messages"][0]["content"] = f"conversation {i} speaks " * 12
    return body


async def _synced(url: str) -> bool:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        text = await response.text()
    synced = [line for line in text.splitlines() if line.startswith("pd_policy_kv_synced{")]
    # Each process's own series: 1 when it reads its feeds, both processes, both prefills.
    return len(synced) == 4 and all(line.endswith(" 1.0") for line in synced)

"""SIGHUP reads the configuration again, against a real ``pd-policy-proxy`` process: a
worker taken out of the file drains (its request in flight finishing) and a new one
joins, a revoked client key stops working and a new one starts, a bad file is refused
with the running configuration kept, and a setting that takes a restart is named. A
watched file is read again when its content (or a keys file's) changes, with no
signal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
from fleet_stands import Stand, serving
from proxy_process import proxy_command, started
from test_http_fleet import chat, post


async def _post(url: str, key: str, body: Any) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}/v1/chat/completions", json=body, headers=headers
    ) as response:  # fmt: skip
        await response.read()
        return response.status


def _config(path: Path, keys: Path, prefill: str, decode: str, **more: object) -> None:
    extra = "".join(f"{k} = {v}\n" for k, v in more.items())
    path.write_text(
        f'mrope = false\napi_keys_file = "{keys}"\n{extra}\n'
        f'[[workers]]\nurl = "{prefill}"\nrole = "prefill"\nkv_mode = "nixl"\n\n'
        f'[[workers]]\nurl = "{decode}"\nrole = "decode"\ncapability = "lm-only"\n'
    )


async def _until(check: Any, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


def test_sighup_reloads_workers_and_keys_keeps_a_running_config_over_a_bad_one(
    tmp_path: Path,
) -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    old, new = Stand("old", describes=False), Stand("new", describes=False)
    config, keys = tmp_path / "proxy.toml", tmp_path / "client-keys"

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d1 = await stack.enter_async_context(serving(old.app()))
            d2 = await stack.enter_async_context(serving(new.app()))
            keys.write_text("key-before\n")
            _config(config, keys, p, d1)
            flags = ("--config", str(config), "--probe-interval", "0.2",
                     "--config-watch-seconds", "0")  # fmt: skip
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            url, process, log = running.url, running.process, running.log
            assert await _post(url, "key-before", chat(1)) == 200 and len(old.calls) == 1
            old.delay = 2.0  # a request in flight on the old decode through the reload
            slow = asyncio.create_task(_post(url, "key-before", chat(2)))
            await _until(lambda: _true(len(old.calls) == 2), "the slow request never started")
            keys.write_text("key-after\n")
            _config(config, keys, p, d2, max_body_mib=8)
            process.send_signal(signal.SIGHUP)
            await _until(lambda: _true(any("SIGHUP: reloaded" in x for x in log)), "no reload")
            (line,) = [x for x in log if "SIGHUP: reloaded" in x]
            assert '"restart": ["max_body_mib"]' in line  # named, and not applied
            assert f'"drained": ["decode {d1}"]' in line and f'"added": ["decode {d2}"]' in line
            assert await _post(url, "key-before", chat(3)) == 401  # revoked
            await _until(lambda: _ok(url, "key-after"), "the new decode never served")
            assert await slow == 200  # finished on the view it started with
            served = len(new.calls)
            assert [await _post(url, "key-after", chat(i)) for i in range(4)] == [200] * 4
            assert len(new.calls) == served + 4 and len(old.calls) == 2  # the old one drained
            # Again, unchanged: the setting still takes a restart (the proxy runs the old
            # value), and nothing else moves.
            process.send_signal(signal.SIGHUP)
            await _until(lambda: _true(sum("SIGHUP: reloaded" in x for x in log) == 2), "again")
            again = [x for x in log if "SIGHUP: reloaded" in x][1]
            assert again.rstrip().endswith('{"restart": ["max_body_mib"]}'), again
            # A bad file: refused, logged, the running configuration kept whole.
            config.write_text("mrope = \n")
            process.send_signal(signal.SIGHUP)
            await _until(lambda: _true(any("refused" in x for x in log)), "no refusal logged")
            assert await _post(url, "key-after", chat(5)) == 200 and len(old.calls) == 2

    asyncio.run(main())


async def _true(value: bool) -> bool:
    return value


async def _ok(url: str, key: str) -> bool:
    return await _post(url, key, chat(0)) == 200


def test_a_watched_file_that_changes_is_read_again_with_no_signal(tmp_path: Path) -> None:
    prefill = Stand("p", lm_only=False, describes=False)
    old, new = Stand("old", describes=False), Stand("new", describes=False)
    config, keys = tmp_path / "proxy.toml", tmp_path / "client-keys"

    def reloads(log: list[str]) -> list[str]:
        return [x for x in log if "changed: reloaded" in x]

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d1 = await stack.enter_async_context(serving(old.app()))
            d2 = await stack.enter_async_context(serving(new.app()))
            keys.write_text("key-1\n")
            _config(config, keys, p, d1, config_watch_seconds=0.2)
            flags = ("--config", str(config), "--probe-interval", "0.2")
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            url, log = running.url, running.log
            assert await _post(url, "key-1", chat(1)) == 200 and len(old.calls) == 1
            # The file rewritten in place: another decode.
            _config(config, keys, p, d2, config_watch_seconds=0.2)
            await _until(lambda: _true(len(reloads(log)) == 1), "the change was not seen")
            assert f'"added": ["decode {d2}"]' in reloads(log)[0]
            await _until(lambda: _ok(url, "key-1"), "the new decode never served")
            assert len(old.calls) == 1
            # Only the keys file changes (a Secret rotated): read again too.
            keys.write_text("key-2\n")
            await _until(lambda: _true(len(reloads(log)) == 2), "the keys' change was not seen")
            assert await _post(url, "key-1", chat(2)) == 401
            assert await _post(url, "key-2", chat(3)) == 200
            # A file swapped for a bad one: refused once, not again until it changes.
            broken = tmp_path / "broken.toml"
            broken.write_text("mrope = \n")
            broken.replace(config)  # as a ConfigMap swaps its file: a rename, not a write
            await _until(lambda: _true(any("refused" in x for x in log)), "no refusal")
            await asyncio.sleep(1.0)
            assert sum("refused" in x for x in log) == 1
            assert await _post(url, "key-2", chat(4)) == 200
            _config(config, keys, p, d1, config_watch_seconds=0.2)
            await _until(lambda: _true(len(reloads(log)) == 3), "the mended file was not read")
            assert f'"drained": ["decode {d2}"]' in reloads(log)[2]

    asyncio.run(main())


#: Long enough that the log filter, which redacts every key, leaves the log lines whole.
KEY = "key-of-the-limits-test"


def _images(count: int) -> dict[str, Any]:
    body = chat(0)
    image = body["messages"][0]["content"][0]
    body["messages"][0]["content"][:1] = [image] * count
    return body


def _reloaded(log: list[str], count: int) -> dict[str, Any]:
    lines = [x for x in log if "SIGHUP: reloaded" in x]
    assert len(lines) == count, lines
    summary: dict[str, Any] = json.loads(lines[-1].split("reloaded ", 1)[1])
    return summary


def test_a_reload_applies_the_limits_to_what_begins_after_it(tmp_path: Path) -> None:
    # Each limit a reload applies is read as a request, a connection or a leg begins: a
    # request in flight keeps its own; the next one, and the next connection, take the new.
    prefill = Stand("p", lm_only=False, describes=False)
    decode = Stand("d", describes=False)
    config, keys = tmp_path / "proxy.toml", tmp_path / "client-keys"

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d = await stack.enter_async_context(serving(decode.app()))
            keys.write_text(f"{KEY}\n")
            _config(config, keys, p, d, request_timeout=30)
            flags = ("--config", str(config), "--probe-interval", "0.2",
                     "--config-watch-seconds", "0")  # fmt: skip
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            url, process, log = running.url, running.process, running.log
            assert (await post(url, _images(2), KEY))[0] == 200
            decode.delay = 1.5  # in flight through the reload, under the old 30 s
            slow = asyncio.create_task(post(url, chat(1), KEY))
            await _until(lambda: _true(len(decode.calls) == 2), "the slow request never began")
            _config(config, keys, p, d, request_timeout=0.5, max_media_items=1,
                    max_client_connections=1)  # fmt: skip
            process.send_signal(signal.SIGHUP)
            await _until(lambda: _true(any("SIGHUP: reloaded" in x for x in log)), "no reload")
            done = _reloaded(log, 1)
            assert done == {"limits": ["max_media_items", "max_client_connections",
                                       "request_timeout"]}, done  # fmt: skip
            assert (await slow)[0] == 200  # began before it: its own deadline
            status, body, _ = await post(url, chat(2), KEY)  # after it: the new deadline
            assert (status, body["error"]["code"]) == (504, "pd_request_timeout")
            decode.delay = 0.0
            status, body, _ = await post(url, _images(2), KEY)
            assert (status, body["error"]["code"]) == (400, "pd_too_many_media_items")
            assert (await post(url, _images(1), KEY))[0] == 200
            # One client connection now: one held idle leaves none for the next.
            host, port = url.removeprefix("http://").rsplit(":", 1)
            _, idle = await asyncio.open_connection(host, int(port))
            await asyncio.sleep(0.2)  # accepted, and held
            status, body, _ = await post(url, chat(3), KEY)
            assert (status, body["error"]["code"]) == (503, "pd_overloaded")
            idle.close()
            await _until(lambda: _ok(url, KEY), "the freed connection never served")
            # The legs' limits: a worker silent past the new read timeout, within the
            # request's; the kept-alive connection to it takes the new limit too.
            _config(config, keys, p, d, request_timeout=30, worker_read_timeout=0.3)
            process.send_signal(signal.SIGHUP)
            await _until(lambda: _true(sum("SIGHUP: reloaded" in x for x in log) == 2), "again")
            assert _reloaded(log, 2) == {
                "limits": [
                    "max_media_items",
                    "max_client_connections",
                    "request_timeout",
                    "worker_read_timeout",
                ]
            }
            decode.delay = 1.0
            status, body, _ = await post(url, chat(4), KEY)
            assert status == 504 and "silent for 0.3 s" in body["error"]["message"], body

    asyncio.run(main())

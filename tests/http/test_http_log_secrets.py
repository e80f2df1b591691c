"""No key in a log line about a client's headers. ``aiohttp``'s server answers a header
line it cannot parse with a 400 and logs the line (``aiohttp.server``, ERROR, the
exception's message in the traceback): ``Authorization: Bearer KEY\\x01...`` would put a
client's key in the log. The proxy's log filter, installed on ``aiohttp``'s loggers and
its own by ``Proxy.app()`` and by the command, redacts every key the proxy knows and any
``Authorization``/``Bearer`` credential from a record's message, arguments and traceback.

The 400's body quotes the line too; it goes back on the connection that sent it, to the
client whose bytes they are, and is left as ``aiohttp`` writes it."""

from __future__ import annotations

import argparse
import asyncio
import logging
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import aiohttp
import pytest
from fleet_stands import Stand, serving

from pd_policy import Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker, cli
from pd_policy_vllm.http import log_filter as log_filter_module
from pd_policy_vllm.http.auth import Keys, read_keys
from pd_policy_vllm.http.config.load import configuration
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.reload import reload

WORKER_KEY: Final = "wk-5e1f-the-workers-key"
CLIENT_KEY: Final = "ck-8a2b-a-clients-key"
ADMIN_KEY: Final = "ak-3c4d-an-admins-key"
UNKNOWN: Final = "uk-9f0e-no-key-of-the-proxys"
SECRETS: Final = (WORKER_KEY, CLIENT_KEY, ADMIN_KEY, UNKNOWN)
LOGGERS: Final = ("aiohttp.server", "aiohttp.access", "aiohttp.web", "aiohttp.internal",
                  "pd_policy_vllm.http", "pd_policy_vllm.http.requests",
                  "pd_policy_vllm.http.admin", "pd_policy_vllm.http.fleet.kv_routing")  # fmt: skip


def _filters() -> list[logging.Filter]:
    return [
        f
        for name in list(logging.root.manager.loggerDict)
        for f in logging.getLogger(name).filters
        if isinstance(f, log_filter_module.KeysFilter)
    ]


@pytest.fixture(autouse=True)
def no_filter_yet() -> Iterator[None]:
    """Each test installs the filter itself: none is left on a logger by another."""

    def remove() -> None:
        for name in list(logging.root.manager.loggerDict):
            logger = logging.getLogger(name)
            for f in list(logger.filters):
                if isinstance(f, log_filter_module.KeysFilter):
                    logger.removeFilter(f)

    remove()
    yield
    remove()


def shown(records: list[logging.LogRecord]) -> str:
    """Everything a handler could print of ``records``: the formatted line with its
    traceback, the arguments, and the exception as a handler of its own would format it."""
    formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")
    out = []
    for record in records:
        out += [formatter.format(record), repr(record.args), repr(record.msg)]
        if record.exc_info and record.exc_info[1] is not None:
            out.append("".join(traceback.format_exception(record.exc_info[1])))
        out.append(str(record.stack_info))
    return "\n".join(out)


async def _raw(url: str, head: bytes) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


HEADS: Final = (
    # The client's key, then a byte no header value may hold.
    b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\x01zz\r\n",
    # A valid key, and another header that is malformed.
    b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\nX-Trace: a\x01b\r\n",
    # A space before the colon: the whole line is an invalid header name.
    b"Authorization : Bearer " + ADMIN_KEY.encode() + b"\r\n",
    # A key the proxy does not know, in a header aiohttp cannot read.
    b"Authorization: Bearer " + UNKNOWN.encode() + b"\x7f\r\n",
    b"X-Api-Key: " + WORKER_KEY.encode() + b"\x00\r\n",
)


def test_a_malformed_header_line_logs_no_key(caplog: pytest.LogCaptureFixture) -> None:
    keys = Keys(WORKER_KEY, (CLIENT_KEY,), (ADMIN_KEY,))

    async def go() -> list[bytes]:
        stand = Stand("p0", lm_only=False)
        async with serving(stand.app()) as at:
            worker = HttpWorker(at, WorkerCapability(Support.FALSE))
            proxy = Proxy(HttpWorker(at), [worker], mrope=False, keys=keys)
            async with serving(proxy.app()) as url:
                line = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
                tail = b"Content-Length: 0\r\n\r\n"
                return [await _raw(url, line + head + tail) for head in HEADS]

    with caplog.at_level(logging.DEBUG):
        answers = asyncio.run(go())
    assert all(a.startswith(b"HTTP/1.") and b" 400 " in a.split(b"\r\n")[0] for a in answers)
    errors = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert len(errors) == len(HEADS)  # each malformed head was logged, and is checked
    text = shown(caplog.records)
    assert not [s for s in SECRETS if s in text], text
    assert text.count("<redacted>") >= 4


def test_the_proxys_own_loggers_and_aiohttps_redact_keys_and_credentials(
    caplog: pytest.LogCaptureFixture,
) -> None:
    Proxy(HttpWorker("http://p"), [HttpWorker("http://d")], mrope=False,
          keys=Keys(WORKER_KEY, (CLIENT_KEY,), (ADMIN_KEY,))).app()  # fmt: skip
    with caplog.at_level(logging.DEBUG):
        for name in LOGGERS:
            log = logging.getLogger(name)
            log.info("headers %s and %r", {"Authorization": f"Bearer {UNKNOWN}"}, CLIENT_KEY)
            log.warning(f"the worker said {WORKER_KEY}; admin {ADMIN_KEY}")
            log.info("authorization=%s", UNKNOWN)
            try:
                raise ValueError(f"Authorization: Basic {UNKNOWN} {WORKER_KEY}")
            except ValueError:
                log.exception("failed")
            log.info("a URL http://user:%s@worker:8000/x", UNKNOWN)
    assert len(caplog.records) == 5 * len(LOGGERS)
    text = shown(caplog.records)
    assert not [s for s in SECRETS if s in text], text
    assert "ValueError" in text and "http://<redacted>@worker:8000/x" in text


def test_the_command_installs_the_filter_before_it_reads_its_workers(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    key = "ck-only-the-command-knows-it"
    monkeypatch.setenv("PD_POLICY_API_KEYS", key)

    async def unreachable(args: argparse.Namespace, keys: Any = None) -> Any:
        logging.getLogger("pd_policy_vllm.http").warning("no worker takes %s", key)
        raise aiohttp.ClientConnectionError("down")

    monkeypatch.setattr(cli, "read_fleet", unreachable)
    with caplog.at_level(logging.INFO):
        assert cli.main(["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9"]) == 2
        logging.getLogger("aiohttp.server").error("Error handling request: %s", key)
    assert _filters()
    text = shown(caplog.records)
    assert key not in text and "no worker takes <redacted>" in text, text


def test_a_client_key_a_reload_adds_is_redacted_from_then_on(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    # The filter knows the keys the proxy started with; a key a reload brings must be
    # redacted too, wherever a line quotes it (here in a header no filter reads as a
    # credential).
    added = "ck-71d3-added-by-a-reload"
    keys_file, config = tmp_path / "client-keys", tmp_path / "proxy.toml"

    async def go() -> bytes:
        async with serving(Stand("p0", lm_only=False).app()) as p, serving(
            Stand("d0").app()
        ) as d:  # fmt: skip
            keys_file.write_text(CLIENT_KEY + "\n")
            config.write_text(
                f'mrope = false\napi_keys_file = "{keys_file}"\n'
                f'[[workers]]\nurl = "{p}"\nrole = "prefill"\nkv_mode = "nixl"\n'
                f'[[workers]]\nurl = "{d}"\nrole = "decode"\ncapability = "lm-only"\n'
            )
            argv = ["--config", str(config)]
            args, _ = configuration(argv, {})
            proxy = Proxy(fleet=await cli.read_fleet(args), mrope=False, keys=_keys(args))
            async with serving(proxy.app()) as url:
                keys_file.write_text(added + "\n")
                _, done = await reload(proxy, args, argv, {})
                assert proxy.keys.admits(f"Bearer {added}") and done.restart == ()
                head = b"X-Api-Key: " + added.encode() + b"\x00\r\n"
                line = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
                return await _raw(url, line + head + b"Content-Length: 0\r\n\r\n")

    with caplog.at_level(logging.DEBUG):
        answer = asyncio.run(go())
    assert b" 400 " in answer.split(b"\r\n")[0]
    assert [r for r in caplog.records if r.name == "aiohttp.server"]  # the line was logged
    text = shown(caplog.records)
    assert added not in text and "<redacted>" in text, text


def _keys(args: argparse.Namespace) -> Keys:
    return read_keys({}, client_keys_file=args.api_keys_file)

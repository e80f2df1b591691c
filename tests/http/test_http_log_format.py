"""``--log-format``: against a real ``pd-policy-proxy`` process logging JSON, every line
of its standard error is one JSON object with an ISO-8601 timestamp, a level and a
logger; a request's record is its fields at the top level, with its id and the client's
trace id; no key appears in any line, a client's key in a malformed header included.
The formatters alone: the text line's shape, the request's context, a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import io
import json
import logging
import sys
from pathlib import Path

import aiohttp
import pytest
from fleet_stands import Stand, serving
from proxy_process import proxy_command, started
from test_http_fleet import chat
from test_http_log_secrets import _raw

from pd_policy_vllm.http.log_format import (
    REQUEST_ID,
    TRACE_ID,
    JsonFormatter,
    TextFormatter,
    configure,
    trace_id_of,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"
CLIENT_KEY = "ck-51aa-a-client-key-in-a-json-log"
WORKER_KEY = "wk-7f02-the-workers-key-in-a-json-log"


def _iso(text: str) -> datetime.datetime:
    moment = datetime.datetime.fromisoformat(text)
    assert moment.tzinfo is not None and text.endswith("Z"), text
    return moment


def test_a_json_proxy_logs_one_object_a_line_and_no_key(tmp_path: Path) -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d")
    (keys := tmp_path / "client-keys").write_text(CLIENT_KEY + "\n")
    (worker_key := tmp_path / "worker-key").write_text(WORKER_KEY + "\n")

    async def main() -> list[str]:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d = await stack.enter_async_context(serving(decode.app()))
            flags = ("--prefill", p, "--decode", d, "--kv-mode", "nixl", "--no-mrope",
                     "--log-format", "json", "--api-keys-file", str(keys),
                     "--worker-api-key-file", str(worker_key))  # fmt: skip
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            headers = {"Authorization": f"Bearer {CLIENT_KEY}", "traceparent": TRACEPARENT,
                       "X-Request-Id": "client-7"}  # fmt: skip
            async with aiohttp.ClientSession() as session, session.post(
                f"{running.url}/v1/chat/completions", json=chat(1), headers=headers
            ) as response:  # fmt: skip
                assert response.status == 200
            head = b"X-Api-Key: " + CLIENT_KEY.encode() + b"\x00\r\n"
            line = b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"
            assert b" 400 " in await _raw(running.url, line + head + b"Content-Length: 0\r\n\r\n")
            await asyncio.sleep(0.3)
            return list(running.log)

    log = asyncio.run(main())
    assert len(log) >= 4
    lines = [json.loads(text) for text in log]  # each line whole, no prefix to strip
    for line in lines:
        assert {"time", "level", "logger"} <= set(line), line
        _iso(line["time"])
    (request,) = [x for x in lines if x["logger"] == "pd_policy_vllm.http.requests"]
    assert request["status"] == 200 and request["outcome"] == "ok"
    assert request["trace_id"] == TRACE and request["client_request_id"] == "client-7"
    assert len(request["request_id"]) == 32 and request["request_id"] != "client-7"
    assert any(x["logger"] == "aiohttp.server" for x in lines)  # the malformed head
    assert not [x for x in log if CLIENT_KEY in x or WORKER_KEY in x], log


def _record(message: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("pd_policy_vllm.http", logging.WARNING, __file__, 1, message,
                               (), None)  # fmt: skip
    for key, value in extra.items():
        setattr(record, key, value)
    return record


def test_the_formatters_shape_and_a_requests_context() -> None:
    text, as_json = TextFormatter(), JsonFormatter()
    plain = text.format(_record("a %s", args=None))
    stamp, level, logger, *rest = plain.split(" ")
    _iso(stamp)
    assert (level, logger, rest) == ("WARNING", "pd_policy_vllm.http:", ["a", "%s"])

    async def in_a_request() -> tuple[str, str]:
        REQUEST_ID.set("r-1")
        TRACE_ID.set(TRACE)
        record = _record("leg failed")
        return text.format(record), as_json.format(record)

    shown, line = asyncio.run(in_a_request())
    assert shown.endswith(f"leg failed [request_id=r-1 trace_id={TRACE}]")
    assert json.loads(line)["request_id"] == "r-1" and json.loads(line)["trace_id"] == TRACE
    assert "request_id" not in json.loads(as_json.format(_record("idle")))  # outside one
    try:
        raise ValueError("boom")
    except ValueError:
        failed = _record("failed", exc_info=sys.exc_info())
    assert "ValueError: boom" in json.loads(as_json.format(failed))["exception"]
    fields = _record("%s", fields={"route": "/v1/chat/completions", "level": "forged"})
    out = json.loads(as_json.format(fields))
    assert out["route"] == "/v1/chat/completions" and out["level"] == "WARNING"


@pytest.mark.parametrize(
    ("header", "trace"),
    [
        (TRACEPARENT, TRACE),
        (f" {TRACEPARENT} ", TRACE),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None),  # the all-zero trace is invalid
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"01-{TRACE}-00f067aa0ba902b7-01", None),  # a version this reads not
        (f"00-{TRACE.upper()}-00f067aa0ba902b7-01", None),  # lower case only
        ("00-" + TRACE + "\n-00f067aa0ba902b7-01", None),
        ("", None),
        (None, None),
    ],
)
def test_only_a_valid_traceparent_gives_a_trace_id(header: str | None, trace: str | None) -> None:
    assert trace_id_of(header) == trace


def test_the_handler_writes_to_the_standard_error_of_the_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Configured while one stderr is in place (a test's capture), then that one closed:
    # a later record goes to the stderr in place then, never to the closed one.
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        configure("json")
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("pd_policy_vllm.http").warning("after the swap")
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
    assert json.loads(second.getvalue())["message"] == "after the swap"

"""Tracing through the proxy, spans kept in memory: a client's request is a server span,
a child of the client's ``traceparent``; each leg a client span under it, whose own
``traceparent`` reaches the worker; attributes an operator filters on; a failed leg's
error; and, tracing off, a client's valid trace context (only it) passed on to each leg.
The live test against ``vllm serve`` workers exporting their own spans is
``tests/vllm/http/test_http_tracing_live.py``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import aiohttp
import pytest
from fleet_stands import Stand, serving
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from test_http_fleet import chat

from pd_policy import InvalidConfiguration, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.tracing import OFF, Tracing, check

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CLIENT_SPAN}-01"


def _tracing() -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test"), provider), exporter


async def _post(url: str, body: Any, headers: dict[str, str]) -> int:
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}/v1/chat/completions", json=body, headers=headers
    ) as response:  # fmt: skip
        await response.read()
        return response.status


def _serve(
    prefill: Stand, decode: Stand, tracing: Tracing, *requests: tuple[Any, dict[str, str]]
) -> list[int]:
    async def main() -> list[int]:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            lm_only = WorkerCapability(Support.FALSE)
            proxy = Proxy(HttpWorker(p), [HttpWorker(d, lm_only)], mrope=False, tracing=tracing)
            async with serving(proxy.app()) as url:
                return [await _post(url, body, headers) for body, headers in requests]

    return asyncio.run(main())


def test_one_trace_from_the_client_through_every_leg_to_the_workers() -> None:
    tracing, spans = _tracing()
    prefill, decode = Stand("p", lm_only=False), Stand("d")
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=x"}
    assert _serve(prefill, decode, tracing, (chat(1, stream=True), headers)) == [200]
    finished = {s.name: s for s in spans.get_finished_spans()}
    server = finished["POST /v1/chat/completions"]
    assert server.kind is SpanKind.SERVER
    assert format(server.context.trace_id, "032x") == TRACE
    assert server.parent is not None and format(server.parent.span_id, "016x") == CLIENT_SPAN
    legs = {name: finished[name] for name in ("prefill", "decode")}
    for name, span in legs.items():
        assert span.kind is SpanKind.CLIENT and span.parent is not None
        assert span.parent.span_id == server.context.span_id
        assert span.attributes is not None and span.attributes["pd_policy.leg"] == name
    # Each worker got its leg span's context: its own spans are the leg's children.
    for stand, name in ((prefill, "prefill"), (decode, "decode")):
        sent = stand.calls[-1]["traceparent"]
        assert sent == f"00-{TRACE}-{format(legs[name].context.span_id, '016x')}-01"
    attributes = server.attributes or {}
    assert attributes["pd_policy.form"] and attributes["pd_policy.attempts"] == 1
    assert str(attributes["pd_policy.decode"]).startswith("http://127.0.0.1:")
    assert attributes["http.response.status_code"] == 200
    assert isinstance(sent := attributes["pd_policy.bytes_sent"], int) and sent > 0


def test_a_failed_leg_and_a_refused_request_carry_their_error() -> None:
    tracing, spans = _tracing()
    prefill, decode = Stand("p", lm_only=False), Stand("d", fail_next=[500, 500])
    n_two = {**chat(2), "n": 2}
    statuses = _serve(prefill, decode, tracing, (chat(1), {}), (n_two, {}))
    assert statuses[0] >= 500 and statuses[1] == 400
    finished = spans.get_finished_spans()
    failed = [s for s in finished if s.name == "decode"]
    assert failed and all(s.status.status_code is StatusCode.ERROR for s in failed)
    servers = [s for s in finished if s.kind is SpanKind.SERVER]
    codes = [(s.attributes or {}).get("error.type") for s in servers]
    assert len(servers) == 2 and all(codes), codes
    assert (servers[1].attributes or {})["http.response.status_code"] == 400


@pytest.mark.parametrize(
    ("headers", "passed"),
    [
        ({"traceparent": TRACEPARENT, "tracestate": "a=1"}, (TRACEPARENT, "a=1")),
        ({"traceparent": TRACEPARENT.upper()}, (None, None)),  # not W3C's: dropped
        ({"traceparent": "garbage", "tracestate": "a=1"}, (None, None)),
        ({"tracestate": "a=1"}, (None, None)),  # no parent: nothing to continue
        ({"traceparent": TRACEPARENT, "tracestate": "a" * 600}, (TRACEPARENT, None)),
        ({}, (None, None)),
    ],
)
def test_tracing_off_passes_only_a_valid_client_context_on(
    headers: dict[str, str], passed: tuple[str | None, str | None]
) -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d")
    assert _serve(prefill, decode, OFF, (chat(1), headers)) == [200]
    for stand in (prefill, decode):
        call = stand.calls[-1]
        assert (call["traceparent"], call["tracestate"]) == passed


def test_an_endpoint_without_opentelemetry_is_a_one_line_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    check("http://127.0.0.1:4317")  # here it is installed
    check(None)
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # as if it were not
    with pytest.raises(InvalidConfiguration) as caught:
        check("http://127.0.0.1:4317")
    assert caught.value.param == "otlp_traces_endpoint" and "\n" not in str(caught.value)

"""One request through the proxy to real ``vllm serve`` workers gives one trace: the
client's span, the proxy's request span under it, a span per leg under that, and each
worker's own request span (vLLM's ``llm_request``, exported by the worker itself with
``--otlp-traces-endpoint``) under the leg that called it; all sent to a collector the
test runs on 127.0.0.1 (``otlp_collector``).

Two workers of the tiny LLaVA on ``NixlConnector``, no development mode: a full-vision
prefill and a ``--language-model-only`` decode, described by the proxy's file."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from http_peers import InProcessProxy, data_url, fleet_args
from llava_prompts import TEXT
from nixl_peers import nixl_server
from otlp_collector import Collector, collector
from router_side import image
from servers import running
from tiny_models import TinyModel

from pd_policy_vllm.http.cli import read_fleet
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.tracing import otlp_tracing

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced(
    llava: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, Collector]]:
    logs = tmp_path_factory.mktemp("tracing-live")
    with collector() as found:
        flags = ("--otlp-traces-endpoint", found.endpoint)
        p = nixl_server("prefill", llava, logs, "kv_producer", limits={"image": 1}, extra=flags)
        d = nixl_server("decode", llava, logs, "kv_consumer", language_model_only=True,
                        extra=flags)  # fmt: skip
        for server in (p, d):
            server.env["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # export within a moment
        with running([p, d]):
            yield p.url, d.url, found


def _body() -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": data_url(image(1))}},
               {"type": "text", "text": f"traced {TEXT}"}]  # fmt: skip
    return {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 4, "temperature": 0}  # fmt: skip


def test_one_request_is_one_trace_through_the_proxy_and_both_vllm_servers(
    traced: tuple[str, str, Collector],
) -> None:
    prefill, decode, found = traced
    args = fleet_args("--prefill", prefill, "--decode", decode, "--no-mrope")
    tracing = otlp_tracing(found.endpoint)
    proxy = Proxy(fleet=asyncio.run(read_fleet(args)), mrope=False, tracing=tracing)
    headers = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
               "Content-Type": "application/json"}  # fmt: skip
    with InProcessProxy(proxy) as running_proxy:
        url, body = f"{running_proxy.url}/v1/chat/completions", json.dumps(_body()).encode()
        request = urllib.request.Request(url, data=body, headers=headers)
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
    tracing.shutdown()  # every span of the proxy's exported

    def whole(spans: list[Any]) -> bool:
        mine = [s for s in spans if s.trace_id == CLIENT_TRACE]
        return sum(s.service != "pd-policy-proxy" for s in mine) >= 2 and len(mine) >= 5

    spans = [s for s in found.wait(whole) if s.trace_id == CLIENT_TRACE]
    by_id = {s.span_id: s for s in spans}
    (served,) = [s for s in spans if s.name == "POST /v1/chat/completions"]
    assert served.parent_id == CLIENT_SPAN and served.service == "pd-policy-proxy"
    legs = {s.name: s for s in spans if s.parent_id == served.span_id}
    assert {"prefill", "decode"} <= set(legs)
    engines = [s for s in spans if s.service != "pd-policy-proxy"]
    # Each worker's span is the child of the leg that called that worker.
    parents = sorted(by_id[s.parent_id].name for s in engines if s.parent_id in by_id)
    assert parents == ["decode", "prefill"], [(s.service, s.name, s.parent_id) for s in engines]
    assert legs["decode"].attributes["server.address"].startswith(decode.split("//")[0])

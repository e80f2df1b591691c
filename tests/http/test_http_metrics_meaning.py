"""The proxy's metrics mean what their names say: time to first token is a stream's
first body byte (a stream that then takes a second more is not a second slower to its
first token), a whole answer has none; every request, a refusal at the door included,
has an end-to-end latency; the latency buckets reach past the longest a request may
take; legs queued for a worker connection are counted; every name follows Prometheus'
conventions and the docs' table is the exposition's."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Final

import aiohttp
import pytest
from fleet_stands import Stand, serving
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from proxy_process import proxy_command, started
from test_http_fleet import chat, post

from pd_policy import Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.fleet.metrics import Metrics, latency_buckets
from pd_policy_vllm.http.fleet.metrics_table import metrics_table
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.upstream import Limits

OBSERVE: Final = Path(__file__).parents[2] / "docs" / "observe.md"


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def _metrics(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        return _samples(await response.text())


def test_ttft_is_a_streams_first_body_byte_and_every_request_has_a_latency() -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d", stream_pause=1.0)

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            lm_only = WorkerCapability(Support.FALSE)
            proxy = Proxy(HttpWorker(p), [HttpWorker(d, lm_only)], mrope=False)
            async with serving(proxy.app()) as url:
                assert (await post(url, chat(1, stream=True)))[0] == 200
                seen = await _metrics(url)
                ttft = seen[("pd_policy_ttft_seconds_sum", ())]
                route = (("route", "/v1/chat/completions"),)
                whole = seen[("pd_policy_request_duration_seconds_sum", route)]
                assert ttft < 0.5 <= 1.0 <= whole, (ttft, whole)  # not the whole stream's
                assert (await post(url, chat(2)))[0] == 200  # a whole answer: no TTFT
                async with aiohttp.ClientSession() as session, session.post(
                    f"{url}/v1/chat/completions", data=b"{not json"
                ) as refused:  # fmt: skip
                    assert refused.status == 400  # refused at the door
                seen = await _metrics(url)
                assert seen[("pd_policy_ttft_seconds_count", ())] == 1
                assert seen[("pd_policy_request_duration_seconds_count", route)] == 3
                long = ("pd_policy_request_duration_seconds_bucket", (("le", "1.0"), *route))
                assert seen[long] == 2  # the stream's second is in its own bucket

    asyncio.run(main())


def test_the_buckets_reach_past_the_longest_a_request_may_take() -> None:
    assert latency_buckets(600)[-1] >= 600 and latency_buckets(30)[-1] == 60.0
    assert latency_buckets(3600)[-1] >= 3600
    text = generate_latest(Metrics(longest=1800).registry).decode()
    bounds = re.findall(r'pd_policy_leg_seconds_bucket\{le="([0-9.e+]+)"', text)
    assert not bounds or float(bounds[-1]) >= 1800
    assert 'pd_policy_request_duration_seconds" histogram' not in text
    proxy = Proxy(HttpWorker("http://p:1"), [HttpWorker("http://d:1")], mrope=False,
                  limits=Limits(read_timeout=900.0))  # fmt: skip
    assert proxy.metrics.duration._upper_bounds[-2] >= 900  # the last finite bound


def test_legs_queued_for_a_worker_connection_are_counted() -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d", delay=0.3)

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            lm_only = WorkerCapability(Support.FALSE)
            proxy = Proxy(HttpWorker(p), [HttpWorker(d, lm_only)], mrope=False,
                          limits=Limits(max_connections=1))  # fmt: skip
            async with serving(proxy.app()) as url:
                answers = await asyncio.gather(*(post(url, chat(i)) for i in range(3)))
                assert [a[0] for a in answers] == [200] * 3
                seen = await _metrics(url)
                assert seen[("pd_policy_upstream_queued_total", ())] >= 2
                assert seen[("pd_policy_upstream_waiting", ())] == 0

    asyncio.run(main())


def test_every_name_follows_the_conventions_and_the_docs_table_is_the_code() -> None:
    rows = metrics_table()
    names = [row[0] for row in rows]
    assert len(names) == len(set(names))
    for name, kind, _labels, _help in rows:
        assert re.fullmatch(r"(pd_policy|process)_[a-z_]+", name), name
        assert (kind == "counter") == name.endswith("_total"), name  # a counter's suffix
        assert not name.endswith("_total") or kind == "counter"
        if kind == "histogram" and name.startswith("pd_policy"):
            assert name.endswith(("_seconds", "_bytes")), name  # a base unit, plural
    exposed = {(r[0], r[1], r[2]) for r in rows}
    text = OBSERVE.read_text()
    shown = re.findall(r"^\| `([a-z_]+)` \| (\w+) \| ([^|]*) \|", text, flags=re.M)
    in_docs = {(n, k, tuple(re.findall(r"`(\w+)`", labels))) for n, k, labels in shown}
    assert in_docs == exposed, in_docs ^ exposed


_METRICS_AT = re.compile(r"metrics on \S+ port (\d+)")


@pytest.mark.parametrize("processes", [1, 2])
def test_the_metrics_port_serves_metrics_alone_with_no_key(tmp_path: Path, processes: int) -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d")
    (keys := tmp_path / "client-keys").write_text("ck-the-api-needs-me\n")

    async def main() -> None:
        async with serving(prefill.app()) as p, serving(decode.app()) as d:
            flags = ("--prefill", p, "--decode", d, "--kv-mode", "nixl", "--no-mrope",
                     "--api-keys-file", str(keys), "--metrics-port", "0",
                     "--processes", str(processes))  # fmt: skip
            async with started(proxy_command(*flags)) as running:
                deadline = time.monotonic() + 30
                while not (found := [m for m in map(_METRICS_AT.search, running.log) if m]):
                    assert time.monotonic() < deadline, running.log
                    await asyncio.sleep(0.1)
                ports = {int(m.group(1)) for m in found}
                assert len(ports) == 1  # every process on the one port
                metrics = f"http://127.0.0.1:{ports.pop()}"
                async with aiohttp.ClientSession() as session:
                    async with session.get(f"{running.url}/metrics") as api:
                        assert api.status == 401  # the API's port keeps its keys
                    while True:
                        async with session.get(f"{metrics}/metrics") as scraped:
                            assert scraped.status == 200
                            text = await scraped.text()
                        if processes == 1 or "pd_policy_processes 2" in text:
                            break
                        assert time.monotonic() < deadline, text
                        await asyncio.sleep(0.2)
                    assert "# TYPE pd_policy_requests_total counter" in text, text
                    async with session.post(f"{metrics}/v1/chat/completions", json=chat(1)) as r:
                        assert r.status == 404  # metrics alone: no API there

    asyncio.run(main())

"""One ``/metrics`` for every process of ``--processes N``: each process's series its
own, labelled by its slot, on real expositions of the proxy's own ``Metrics``; and,
against a real ``pd-policy-proxy`` of two processes, every scrape counting every request,
whichever process takes it, and a restarted process counted."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time

import aiohttp
from fleet_stands import Stand, serving
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from proxy_process import proxy_command, started
from test_http_fleet import chat
from test_http_lifecycle import _flags, _post
from test_http_processes import _children, two_children

from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.fleet.metrics import Metrics
from pd_policy_vllm.http.fleet.metrics_merge import merge
from pd_policy_vllm.openai.workers import HttpWorker


def _values(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def _fleet() -> Fleet:
    return Fleet.pair(HttpWorker("http://p:1"), [HttpWorker("http://d:1")])


def test_each_processs_series_are_its_own_labelled_by_its_slot() -> None:
    fleet = _fleet()
    decode = fleet.of("decode")[0]
    one, two = Metrics(), Metrics()
    one.record("chat", "full", "ok", legs=[("prefill", 0.02)], ttft=0.3)
    two.record("chat", "full", "ok", legs=[("prefill", 4.0)])
    two.record("chat", "full", "pd_n_gt_1")  # a label set only one process has seen
    decode.outstanding = 2
    first = one.render(fleet)
    two.up.labels("decode", decode.name).set(0)  # ejected in this process's view only
    two.outstanding.labels("decode", decode.name).set(5)
    second = generate_latest(two.registry)  # as set, not as the fleet says
    merged = _values(merge({"0": first, "1": second}))
    # Every sample is one process's: nothing is summed or chosen here, so a process
    # restarted is a reset of its own series (what rate() expects), never a drop in a sum.
    assert all(dict(labels).get("process") in ("0", "1") for _, labels in merged)
    assert len(merged) == len(_values(first)) + len(_values(second))
    ok = (("form", "full"), ("outcome", "ok"))
    requests = "pd_policy_requests_total"
    assert merged[(requests, (*ok, ("process", "0"), ("route", "chat")))] == 1
    assert merged[(requests, (*ok, ("process", "1"), ("route", "chat")))] == 1
    refused = (("form", "full"), ("outcome", "pd_n_gt_1"), ("process", "1"), ("route", "chat"))
    assert merged[(requests, refused)] == 1
    legs = "pd_policy_leg_seconds"
    assert merged[(f"{legs}_sum", (("leg", "prefill"), ("process", "1")))] == 4.0
    assert merged[(f"{legs}_bucket", (("le", "0.025"), ("leg", "prefill"), ("process", "0")))] == 1
    worker = (("process", "1"), ("role", "decode"), ("worker", decode.name))
    assert merged[("pd_policy_worker_outstanding", worker)] == 5
    assert merged[("pd_policy_worker_up", worker)] == 0


def test_one_process_merged_is_itself_labelled() -> None:
    fleet, metrics = _fleet(), Metrics()
    metrics.record("completions", "text", "ok", legs=[("decode", 1.5)], decode_bytes=900)
    text = metrics.render(fleet)
    labelled = {(n, tuple(sorted((*labels, ("process", "3"))))): v
                for (n, labels), v in _values(text).items()}  # fmt: skip
    assert _values(merge({"3": text})) == labelled


def _sum(text: str, name: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    )


async def _scrape(url: str) -> str:
    # A connection of its own: the kernel may give it to either process.
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        assert response.status == 200
        return await response.text()


def test_every_scrape_of_two_processes_counts_every_request() -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d")

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d = await stack.enter_async_context(serving(decode.app()))
            flags = _flags(p, d, "--processes", "2", "--pre-stop-seconds", "0")
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            url, process = running.url, running.process
            deadline = time.monotonic() + 60
            await two_children(process.pid, deadline)
            await asyncio.sleep(0.5)  # both listening
            assert await asyncio.gather(*(_post(url, chat(i)) for i in range(16))) == [200] * 16
            assert len(decode.calls) == 16
            scrapes = await asyncio.gather(*(_scrape(url) for _ in range(8)))
            for text in scrapes:
                assert _sum(text, "pd_policy_requests_total") == 16, text
                assert _sum(text, "pd_policy_processes") == 2
            # A process killed: the one started in its place is counted, in every scrape.
            os.kill(min(_children(process.pid)), signal.SIGKILL)
            while True:
                assert time.monotonic() < deadline + 30, "the restart was never counted"
                try:
                    texts = await asyncio.gather(*(_scrape(url) for _ in range(4)))
                except aiohttp.ClientConnectionError:
                    # A connection the kernel queued to the process killed is reset:
                    # SO_REUSEPORT's way with a crash, not the proxy's.
                    await asyncio.sleep(0.2)
                    continue
                counted = [_sum(t, "pd_policy_process_restarts_total") for t in texts]
                if counted == [1] * 4 and all(_sum(t, "pd_policy_processes") == 2 for t in texts):
                    break
                await asyncio.sleep(0.2)

    asyncio.run(main())

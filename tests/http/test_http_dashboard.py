"""The Grafana dashboard in ``deploy/grafana``: valid dashboard JSON (every panel placed,
typed and queried against the dashboard's Prometheus variable), and every metric its
queries name exposed by a running ``pd-policy-proxy`` (two processes, KV routing on
stand-in prefills that publish vLLM's KV events)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
from proxy_process import proxy_command, started

from kv_stub import kv_stubs

DASHBOARD: Final = Path(__file__).parents[2] / "deploy" / "grafana" / "pd-policy-proxy.json"
_METRIC: Final = re.compile(r"\b((?:pd_policy|process)_[a-z_]+)")
_SUFFIXES: Final = ("_bucket", "_count", "_sum")
_PANELS: Final = {"row", "timeseries", "stat"}


def _dashboard() -> dict[str, Any]:
    value = json.loads(DASHBOARD.read_text())
    assert isinstance(value, dict)
    return value


def _queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", ())]


def _named(queries: list[str]) -> set[str]:
    names = {m for q in queries for m in _METRIC.findall(q)}
    return {next((n[: -len(s)] for s in _SUFFIXES if n.endswith(s)), n) for n in names}


def test_the_dashboard_is_valid_dashboard_json() -> None:
    board = _dashboard()
    assert board["uid"] and board["title"] and isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        assert panel["type"] in _PANELS, panel["type"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) for k in ("x", "y", "w", "h"))
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        covered = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                   for y in range(grid["y"], grid["y"] + grid["h"])}  # fmt: skip
        assert not covered & cells, f"{panel['title']} overlaps another panel"
        cells |= covered
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(refs) == len(set(refs))
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}")
            assert 'job=~"$job"' in expr  # every query follows the dashboard's job
    # What the issue asks of it, each on some panel.
    wanted = {"pd_policy_requests_total", "pd_policy_ttft_seconds",
              "pd_policy_request_duration_seconds", "pd_policy_worker_outstanding",
              "pd_policy_worker_up", "pd_policy_ejections_total", "pd_policy_retries_total",
              "pd_policy_kv_routing_total", "pd_policy_kv_blocks_total",
              "pd_policy_media_fetches_total", "pd_policy_upstream_queued_total"}  # fmt: skip
    assert wanted <= _named(_queries(board))


def _exposed(text: str) -> set[str]:
    # Every family a scrape declares ("# TYPE name kind"), as its samples are named.
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            names.add(name + "_total" if kind == "counter" and not name.endswith("_total")
                      else name)  # fmt: skip
    return names


def test_every_metric_the_dashboard_queries_is_exposed_by_a_running_proxy() -> None:
    async def main() -> str:
        async with contextlib.AsyncExitStack() as stack:
            stubs = await stack.enter_async_context(kv_stubs(1, 1))
            flags = ["--prefill", stubs.prefills[0].url, "--decode", stubs.decodes[0].url,
                     "--kv-routing", "--no-mrope", "--processes", "2"]  # fmt: skip
            running = await stack.enter_async_context(started(proxy_command(*flags)))
            deadline = time.monotonic() + 60
            async with aiohttp.ClientSession() as session:
                while True:
                    async with session.get(f"{running.url}/metrics") as response:
                        text = await response.text()
                    if "pd_policy_processes 2" in text or time.monotonic() > deadline:
                        return text
                    await asyncio.sleep(0.2)

    text = asyncio.run(main())
    missing = _named(_queries(_dashboard())) - _exposed(text)
    assert not missing, f"the dashboard queries metrics no proxy exposes: {sorted(missing)}"

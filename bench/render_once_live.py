"""``make bench-routing``, live, render once: the time to first token and the prefills' CPU
with each prefill leg sent as token-in from the KV lookup's render, and without
(``--no-render-once``: the prefill is sent the client's body and renders it again), in
one run, as ratios.

The fleet and the trace are ``routing_live.py``'s: two full-vision tiny LLaVA prefills
that publish their KV events and one ``--language-model-only`` decode, 47 chat requests,
37 of them with one of four images (a conversation sends its image again every turn). A
second trace is the same with every request's image a new one, which no processor cache
holds: in the first, a prefill sent the client's body finds a repeated image processed
in its cache (its render route keeps a cache of its own), so that only a new image is
processed twice without render once. The KV-routing proxy (a process) replays each trace
``ROUNDS`` times each way, alternating, without render once first, each replay after the
workers' prefix caches were emptied. Each request is streamed, one at a time, a tenth of
a second apart: its time to first token is the client's wait for the first server-sent
event (vLLM sends it with the first token). Around each request the CPU time of each
prefill's process group (its API server and its engine core: ``utime + stime`` of every
process of the group, from ``/proc/<pid>/stat``) and of the proxy's is read: the
prefills' CPU includes the lookup's render, which runs on a prefill either way. Which
route each prefill leg took is read from the prefills' access logs, and the tokens the
prefills served from their caches from the answers' usage: equal both ways, since render
once names the blocks as the client's body does.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final

#: Replays each way, alternating.
ROUNDS: Final = 2
MODES: Final = {"rendered once": (), "rendered again": ("--no-render-once",)}
_TICK: Final = os.sysconf("SC_CLK_TCK")
_GENERATE: Final = b'"POST /inference/v1/generate HTTP'
_CHAT: Final = b'"POST /v1/chat/completions HTTP'

#: A proxy with flags: its URL and process id while the block runs, ready to serve.
Proxy = Callable[[Sequence[str]], AbstractContextManager[tuple[str, int]]]


def group_cpu(pgid: int) -> float:
    """The CPU seconds (user and system) the live processes of group ``pgid`` have used."""
    ticks = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone since the listing
            continue
        # The fields after the command's closing parenthesis, from the state (field 3).
        fields = stat.rpartition(")")[2].split()
        if int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICK


def stream(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Stream ``body`` through the chat route at ``url``: the seconds to its first event,
    and the usage its last chunk carries."""
    data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}})
    request = urllib.request.Request(
        f"{url}/v1/chat/completions", data.encode(), {"Content-Type": "application/json"}
    )
    began, first = time.monotonic(), 0.0
    usage: dict[str, Any] = {}
    with urllib.request.urlopen(request, timeout=120) as response:
        for line in response:
            if not line.startswith(b"data:"):
                continue
            first = first or time.monotonic() - began
            payload = line[5:].strip()
            if payload != b"[DONE]":
                usage = json.loads(payload).get("usage") or usage
    return first, usage


def _legs(logs: Iterable[Path], sizes: dict[Path, int]) -> dict[str, int]:
    found = {"generate": 0, "chat": 0}
    for log in logs:
        with log.open("rb") as read:
            read.seek(sizes.get(log, 0))
            text = read.read()
        found["generate"] += text.count(_GENERATE)
        found["chat"] += text.count(_CHAT)
    return found


def replay(fleet: Any, proxy: Proxy, flags: Sequence[str], bodies: Sequence[Any]) -> dict[str, Any]:
    """One replay of ``bodies`` through a KV-routing proxy with ``flags`` in front of
    ``fleet`` (a ``kv_fleet.KvFleet``), its caches emptied first: per request, the time
    to first token and the CPU of the prefills and the proxy."""
    fleet.reset_prefix_caches()
    prefills = [fleet.pids[name] for name in fleet.prefills]
    logs = [fleet.logs / f"{name}.log" for name in fleet.prefills]
    sizes = {log: log.stat().st_size for log in logs}
    rows = []
    with proxy(["--kv-routing", *flags]) as (url, pid):
        for body in bodies:
            before = sum(group_cpu(p) for p in prefills), group_cpu(pid)
            ttft, usage = stream(url, body)
            after = sum(group_cpu(p) for p in prefills), group_cpu(pid)
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            prompt = usage.get("prompt_tokens", 0)
            rows.append((ttft, after[0] - before[0], after[1] - before[1], prompt, cached))
            time.sleep(0.1)
    time.sleep(1.0)  # the access log's last lines
    return {"rows": rows, "legs": _legs(logs, sizes)}


def _summary(replays: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [row for r in replays for row in r["rows"]]
    ttft, prefill, proxy = ([row[i] * 1e3 for row in rows] for i in range(3))
    legs = {k: sum(r["legs"][k] for r in replays) for k in ("generate", "chat")}
    return {
        "requests": len(rows),
        "ttft_ms_p50": round(statistics.median(ttft), 1),
        "ttft_ms_mean": round(statistics.fmean(ttft), 1),
        "prefill_cpu_ms": round(statistics.fmean(prefill), 1),
        "proxy_cpu_ms": round(statistics.fmean(proxy), 1),
        "prompt_tokens": sum(row[3] for row in rows) // len(replays),
        "cached_tokens": sum(row[4] for row in rows) // len(replays),
        "prefill_legs": legs,
    }


def new_images(
    bodies: Sequence[dict[str, Any]], picture: Callable[[int], str], replay: int
) -> list[dict[str, Any]]:
    """``bodies`` with every image a new one (``picture(seed)``: a data URL), none seen in
    another replay (``replay``: its number): no worker's processor cache holds it."""
    out = []
    for number, body in enumerate(bodies):
        seed = 10_000 + 1_000 * replay + number
        messages = [
            {**m, "content": [{**part, "image_url": {"url": picture(seed)}}
                              if part.get("type") == "image_url" else part
                              for part in m["content"]]}
            if isinstance(m["content"], list) else m
            for m in body["messages"]
        ]  # fmt: skip
        out.append({**body, "messages": messages})
    return out


def compare(
    fleet: Any, proxy: Proxy, traces: dict[str, Callable[[int], Sequence[Any]]]
) -> dict[str, Any]:
    """Each trace (by name: its bodies for a replay's number) replayed each way
    (``MODES``), ``ROUNDS`` times, alternating; each way's figures, the ratios of render
    once's to the other's, and the prefills' idle CPU."""
    prefills = [fleet.pids[name] for name in fleet.prefills]
    idle = sum(group_cpu(p) for p in prefills)
    time.sleep(2.0)
    idle = (sum(group_cpu(p) for p in prefills) - idle) / 2.0
    results, number = {}, 0
    for name, bodies in traces.items():
        replays: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for _ in range(ROUNDS):
            for mode in reversed(MODES):  # without render once first
                replays[mode].append(replay(fleet, proxy, MODES[mode], bodies(number)))
                number += 1
        ways = {mode: _summary(replays[mode]) for mode in MODES}
        once, again = ways["rendered once"], ways["rendered again"]
        ratios = {key: round(once[key] / again[key], 3) for key in
                  ("ttft_ms_p50", "ttft_ms_mean", "prefill_cpu_ms", "proxy_cpu_ms")}  # fmt: skip
        results[name] = {"ways": ways, "ratios": ratios}
    return {"traces": results, "rounds": ROUNDS,
            "idle_prefill_cpu_ms_per_s": round(idle * 1e3, 1)}  # fmt: skip


def table(results: dict[str, Any]) -> str:
    """The render-once rows of docs/performance.md's live routing block."""
    lines = [
        "| trace | KV routing | prefill legs: generate / chat | TTFT p50 | TTFT mean "
        "| prefill CPU a request | proxy CPU a request | cached tokens |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for name, trace in results["traces"].items():
        for mode, row in trace["ways"].items():
            legs = row["prefill_legs"]
            lines.append(f"| {name} | {mode} | {legs['generate']} / {legs['chat']} "
                         f"| {row['ttft_ms_p50']} ms | {row['ttft_ms_mean']} ms "
                         f"| {row['prefill_cpu_ms']} ms | {row['proxy_cpu_ms']} ms "
                         f"| {row['cached_tokens']:,} |")  # fmt: skip
        r = trace["ratios"]
        lines.append(f"| {name} | **ratio** (once ÷ again) | | **{r['ttft_ms_p50']:.3f}** "
                     f"| **{r['ttft_ms_mean']:.3f}** | **{r['prefill_cpu_ms']:.3f}** "
                     f"| {r['proxy_cpu_ms']:.3f} | |")  # fmt: skip
    idle = results["idle_prefill_cpu_ms_per_s"]
    lines += ["", f"Each trace, each way: {results['rounds']} replays, alternating, caches "
              "emptied before each, requests streamed one at a time (\"every image new\": the "
              "trace with each request's image replaced by one no replay saw). Prefill CPU: "
              "both prefills' process groups, the lookup's render included, read around each "
              f"request (idle, they use {idle} ms a second)."]  # fmt: skip
    return "\n".join(lines)

"""What the HTTP proxy adds per request, next to a minimal forward-the-original-body proxy.

Both proxies run as processes of their own in front of the same stub workers
(``bench/http_stubs.py``), on loopback, with no access log; this process drives
them with an ``aiohttp`` client. Per proxy, in one run:

- p50 and p99 latency added over calling the decode stub directly (sequential
  requests, a 64 KiB image);
- requests per second, 16 at a time, and the proxy process's CPU per request, with
  a 64 KiB and a 1 MiB image, in rounds that alternate the proxies: each proxy is
  one asyncio process, so one core. A third process takes part in these rounds, the
  minimal proxy with a text-only decode leg (``one-copy``): what each proxy spends
  beyond it is, for the minimal proxy, its second copy of the image, and for
  pd-policy, the policy's work;
- memory per in-flight request: the proxy's RSS with 200 requests held at the
  decode stub, less its RSS idle, per request;
- bytes the decode stub received per request, with no image, a 64 KiB and a
  1 MiB image.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
from measuring import percentile

HERE = Path(__file__).resolve().parent
_JSON = {"Content-Type": "application/json"}
TARGET_LATENCY = 1.2
TARGET_THROUGHPUT = 1.0
#: The minimal proxy with a text-only decode leg: one copy of the image, no policy.
ONE_COPY = "one-copy forwarder"


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _body(image_bytes: int, **extra: Any) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": "what is in the picture?"}]
    if image_bytes:
        data = base64.b64encode(os.urandom(image_bytes)).decode()
        content.insert(
            0, {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}}
        )
    return {"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 8,
            **extra}  # fmt: skip


@contextlib.contextmanager
def _process(
    *argv: str, program: str = sys.executable, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    # Its own session: stopped with everything it started, by process group.
    process = subprocess.Popen(
        [program, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env=env,
    )  # fmt: skip
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=30)


async def _ready(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            async with session.post(url, json=body) as response:
                if response.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer")
        await asyncio.sleep(0.3)


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


async def _post(session: aiohttp.ClientSession, url: str, data: bytes) -> float:
    start = time.perf_counter()
    async with session.post(url, data=data, headers=_JSON) as response:
        await response.read()
    return time.perf_counter() - start


async def _latencies(
    session: aiohttp.ClientSession, urls: dict[str, str], data: bytes, count: int
) -> dict[str, list[float]]:
    # Interleaved, in a rotating order: this machine's speed drifts by 10-20% over
    # minutes, and every target should see the same drift.
    out: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    for i in range(count):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            out[name].append(await _post(session, urls[name], data))
    return out


async def _throughput(
    session: aiohttp.ClientSession, url: str, body: Any, seconds: float, clients: int = 16
) -> float:
    done = 0
    end = time.monotonic() + seconds

    async def worker() -> None:
        nonlocal done
        while time.monotonic() < end:
            async with session.post(url, json=body) as response:
                await response.read()
            done += 1

    await asyncio.gather(*(worker() for _ in range(clients)))
    return done / seconds


def _cpu_seconds(pid: int) -> float:
    # utime + stime of the process, from /proc (fields 14 and 15).
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _paired_throughput(
    session: aiohttp.ClientSession, urls: dict[str, str], pids: dict[str, int], body: Any,
    seconds: float, rounds: int,
) -> dict[str, Any]:  # fmt: skip
    # Rounds alternate which proxy goes first, so drift over the run falls on both; each
    # ratio is a median of per-round ratios. CPU per request is the proxy process's own
    # CPU time over the requests it served: the steadiest figure on shared cores.
    names = list(urls)
    per_round: list[dict[str, tuple[float, float]]] = []
    for i in range(rounds):
        figures = {}
        for name in names if i % 2 == 0 else names[::-1]:
            before = _cpu_seconds(pids[name])
            rps = await _throughput(session, urls[name], body, seconds)
            figures[name] = (rps, (_cpu_seconds(pids[name]) - before) / (rps * seconds))
        per_round.append(figures)
    ours, minimal, one_copy = names

    def excess(name: str) -> float:  # CPU ms per request over the one-copy forwarder's
        return statistics.median(r[name][1] - r[one_copy][1] for r in per_round) * 1e3

    return {
        "requests_per_second": {n: statistics.median(r[n][0] for r in per_round) for n in names},
        "cpu_ms_per_request": {
            n: statistics.median(r[n][1] for r in per_round) * 1e3 for n in names
        },
        "rps_ratio": statistics.median(r[ours][0] / r[minimal][0] for r in per_round),
        "cpu_ratio": statistics.median(r[ours][1] / r[minimal][1] for r in per_round),
        "policy_cpu_ms": excess(ours),
        "second_copy_cpu_ms": excess(minimal),
    }


async def _in_flight_bytes(
    session: aiohttp.ClientSession, url: str, pid: int, requests: int
) -> float:
    idle = _rss(pid)
    held = [asyncio.ensure_future(session.post(url, json=_body(64 * 1024, bench_hold=3.0)))
            for _ in range(requests)]  # fmt: skip
    await asyncio.sleep(2.0)
    busy = _rss(pid)
    for response in await asyncio.gather(*held):
        await response.read()
        response.release()
    return max(busy - idle, 0) / requests


async def _stats(session: aiohttp.ClientSession, decode: str) -> list[int]:
    async with session.get(f"{decode}/stats") as response:
        received: list[int] = (await response.json())["received"]
        return received


async def _measure(quick: bool) -> dict[str, Any]:
    prefill_port, decode_port, ours_port, minimal_port = (_port() for _ in range(4))
    prefill, decode = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    count, seconds = (150, 2.0) if quick else (600, 4.0)
    proxies = {
        "pd-policy": (ours_port, ["-m", "pd_policy_vllm.http.cli", "--prefill", prefill,
                                  "--decode", decode, "--port", str(ours_port), "--kv-mode",
                                  "nixl", "--decode-capability", "lm-only", "--no-mrope",
                                  "--no-access-log"]),
        "minimal": (minimal_port, [str(HERE / "minimal_proxy.py"), str(minimal_port),
                                   prefill, decode]),
    }  # fmt: skip
    results: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=120)
    connector = aiohttp.TCPConnector(limit=0)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_process(str(HERE / "http_stubs.py"), str(prefill_port),
                                     str(decode_port)))  # fmt: skip
        processes = {
            name: stack.enter_context(_process(*argv)) for name, (_, argv) in proxies.items()
        }
        urls = {name: f"http://127.0.0.1:{port}/v1/chat/completions"
                for name, (port, _) in proxies.items()}  # fmt: skip
        urls["direct"] = f"{decode}/v1/chat/completions"
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            body = _body(64 * 1024)
            data = json.dumps(body).encode()
            for url in urls.values():
                await _ready(session, url, body)
            await _latencies(session, urls, data, 20)  # warm-up
            latencies = await _latencies(session, urls, data, count)
            direct = latencies["direct"]
            for name in proxies:
                sizes = {}
                for label, size in (("none", 0), ("64KiB", 64 * 1024), ("1MiB", 2**20)):
                    await _stats(session, decode)
                    for _ in range(3):
                        await _post(session, urls[name], json.dumps(_body(size)).encode())
                    sizes[label] = statistics.median(await _stats(session, decode))
                ms = latencies[name]
                results[name] = {
                    "added_p50_ms": (statistics.median(ms) - statistics.median(direct)) * 1e3,
                    "added_p99_ms": (percentile(ms, 0.99) - percentile(direct, 0.99)) * 1e3,
                    "bytes_per_in_flight_request": await _in_flight_bytes(
                        session, urls[name], processes[name].pid, 200
                    ),
                    "bytes_to_decode": sizes,
                }
            proxy_urls = {name: urls[name] for name in proxies}
            pids = {name: p.pid for name, p in processes.items()}
            one_copy_port = _port()
            one_copy = stack.enter_context(_process(str(HERE / "minimal_proxy.py"),
                                                    str(one_copy_port), prefill, decode,
                                                    "one-copy"))  # fmt: skip
            proxy_urls[ONE_COPY] = f"http://127.0.0.1:{one_copy_port}/v1/chat/completions"
            pids[ONE_COPY] = one_copy.pid
            await _ready(session, proxy_urls[ONE_COPY], body)
            rounds = 3 if quick else 5
            for label, size in (("64KiB", 64 * 1024), ("1MiB", 2**20)):
                results[f"throughput_{label}"] = await _paired_throughput(
                    session, proxy_urls, pids, _body(size), seconds / 2, rounds
                )
            for name in proxies:
                results[name]["requests_per_second"] = results["throughput_64KiB"][
                    "requests_per_second"
                ][name]
    ours, minimal = results["pd-policy"], results["minimal"]
    results["latency_over_minimal"] = ours["added_p50_ms"] / minimal["added_p50_ms"]
    results["ours_bytes_1MiB_over_none"] = (
        ours["bytes_to_decode"]["1MiB"] / ours["bytes_to_decode"]["none"]
    )
    results["minimal_bytes_1MiB_over_none"] = (
        minimal["bytes_to_decode"]["1MiB"] / minimal["bytes_to_decode"]["none"]
    )
    return results


def measure(quick: bool = False) -> dict[str, Any]:
    """Run the proxy benchmark; see the module docs."""
    return asyncio.run(_measure(quick))


def table(results: dict[str, Any]) -> str:
    """The proxy figures, as a markdown table with the targets."""
    header = (
        "| proxy | added p50 | added p99 | requests/s (one core) | memory per in-flight "
        "request | bytes to decode: none / 64 KiB / 1 MiB image |"
    )
    rows = [header, "|---|---|---|---|---|---|"]
    for name in ("pd-policy", "minimal"):
        r = results[name]
        sizes = " / ".join(
            f"{r['bytes_to_decode'][k] / 1024:.1f} KiB" for k in ("none", "64KiB", "1MiB")
        )
        rows.append(
            f"| {name} | {r['added_p50_ms']:.2f} ms | {r['added_p99_ms']:.2f} ms | "
            f"{r['requests_per_second']:.0f} | {r['bytes_per_in_flight_request'] / 1024:.1f} KiB "
            f"| {sizes} |"
        )
    ratio = results["latency_over_minimal"]
    met = "met" if ratio <= TARGET_LATENCY else "**missed**"
    rows += [
        "",
        f"pd-policy's added p50 ÷ the minimal proxy's: {ratio:.2f} (target ≤ {TARGET_LATENCY}: "
        f"{met}). Bytes to decode, 1 MiB image ÷ none: pd-policy "
        f"{results['ours_bytes_1MiB_over_none']:.2f}, the minimal proxy "
        f"{results['minimal_bytes_1MiB_over_none']:.2f}.",
        "",
        "| image | requests/s: pd-policy / minimal | ÷ minimal (target ≥ "
        f"{TARGET_THROUGHPUT}) | proxy CPU per request: pd-policy / minimal | ÷ minimal |",
        "|---|---|---|---|---|",
    ]
    for label in ("64KiB", "1MiB"):
        t = results.get(f"throughput_{label}")
        if t is None:
            continue
        rps, cpu = t["requests_per_second"], t["cpu_ms_per_request"]
        verdict = "met" if t["rps_ratio"] >= TARGET_THROUGHPUT else "**missed**"
        rows.append(
            f"| {label.replace('KiB', ' KiB').replace('MiB', ' MiB')} | "
            f"{rps['pd-policy']:.0f} / {rps['minimal']:.0f} | {t['rps_ratio']:.2f} ({verdict}) | "
            f"{cpu['pd-policy']:.2f} / {cpu['minimal']:.2f} ms | {t['cpu_ratio']:.2f} |"
        )
    rows += [
        "",
        "| image | CPU per request of the one-copy forwarder | the minimal proxy's second "
        "copy (minimal less it) | the policy's work (pd-policy less it) |",
        "|---|---|---|---|",
    ]
    for label in ("64KiB", "1MiB"):
        t = results.get(f"throughput_{label}")
        if t is None or "policy_cpu_ms" not in t:
            continue
        rows.append(
            f"| {label.replace('KiB', ' KiB').replace('MiB', ' MiB')} | "
            f"{t['cpu_ms_per_request'][ONE_COPY]:.2f} ms | {t['second_copy_cpu_ms']:+.2f} ms | "
            f"{t['policy_cpu_ms']:+.2f} ms |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(measure(quick="--quick" in sys.argv)))

"""A long run through ``pd-policy-proxy``: does its memory stay flat?

The proxy runs as a process of its own in front of the stub workers
(``bench/http_stubs.py``), as in ``bench/http_proxy.py``. After a warm-up (the allocator,
the connection pools and the interpreter's caches settle), 10⁵ requests go through it,
16 at a time, each with an image of its own (a fresh 512-byte payload: whatever the proxy
keeps per image, it would keep 10⁵ of), every tenth with a ``cache_salt`` of its own and
every hundredth refused (a malformed body). The proxy's RSS is read before and after;
the growth is the figure, and the target is at most 10 MB.

Run: ``python bench/soak.py [--quick]`` (``--quick``: 10⁴ requests).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
from http_proxy import _body, _port, _process, _ready, _rss

HERE: Final = Path(__file__).resolve().parent
NAME: Final = "performance-soak"
TARGET_MB: Final = 10.0
CLIENTS: Final = 16


def _request(i: int) -> bytes:
    if i % 100 == 99:
        return b'{"model": "m", "messages": '  # cut short: a 400, nothing kept
    data = base64.b64encode(os.urandom(512)).decode()
    content = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{data}"}},
               {"type": "text", "text": "what is in the picture?"}]  # fmt: skip
    body: dict[str, Any] = {"model": "m", "max_tokens": 8,
                            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    if i % 10 == 0:
        body["cache_salt"] = f"tenant-{i}"
    return json.dumps(body).encode()


async def _drive(session: aiohttp.ClientSession, url: str, count: int) -> dict[str, int]:
    statuses: dict[str, int] = {}
    queue = iter(range(count))

    async def client() -> None:
        for i in queue:
            data = _request(i)
            async with session.post(
                url, data=data, headers={"Content-Type": "application/json"}
            ) as r:
                await r.read()
                statuses[str(r.status)] = statuses.get(str(r.status), 0) + 1

    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return statuses


async def _measure(requests: int, warm_up: int) -> dict[str, Any]:
    prefill_port, decode_port, proxy_port = (_port() for _ in range(3))
    prefill, decode = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    argv = ["-m", "pd_policy_vllm.http.cli", "--prefill", prefill, "--decode", decode,
            "--port", str(proxy_port), "--kv-mode", "nixl", "--decode-capability", "lm-only",
            "--no-mrope", "--no-access-log"]  # fmt: skip
    url = f"http://127.0.0.1:{proxy_port}/v1/chat/completions"
    with (
        _process(str(HERE / "http_stubs.py"), str(prefill_port), str(decode_port)),
        _process(*argv) as proxy,
    ):
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await _ready(session, url, _body(512))
            await _drive(session, url, warm_up)
            before = _rss(proxy.pid)
            began = time.perf_counter()
            statuses = await _drive(session, url, requests)
            seconds = time.perf_counter() - began
            after = _rss(proxy.pid)
    growth = (after - before) / 1e6
    return {"requests": requests, "warm_up": warm_up, "seconds": seconds,
            "rss_before_mb": before / 1e6, "rss_after_mb": after / 1e6, "growth_mb": growth,
            "statuses": statuses, "target_met": growth <= TARGET_MB}  # fmt: skip


def measure(quick: bool = False) -> dict[str, Any]:
    """Run the soak; see the module docs."""
    return asyncio.run(_measure(10_000 if quick else 100_000, 2_000 if quick else 5_000))


def table(results: dict[str, Any]) -> str:
    """The soak's figures, as a markdown table with its target."""
    statuses = ", ".join(f"{n} of {s}" for s, n in sorted(results["statuses"].items()))
    met = "met" if results["target_met"] else "**missed**"
    return "\n".join([
        "| requests | RSS before | RSS after | growth | target | met |",
        "|---:|---:|---:|---:|---|---|",
        f"| {results['requests']:,} | {results['rss_before_mb']:.1f} MB | "
        f"{results['rss_after_mb']:.1f} MB | {results['growth_mb']:+.2f} MB | ≤ {TARGET_MB:g} MB "
        f"| {met} |",
        "",
        f"After {results['warm_up']:,} requests of warm-up; {results['seconds']:.0f} s, 16 at a "
        f"time; answers: {statuses}.",
    ])  # fmt: skip


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        print(table(measure(quick="--quick" in sys.argv)))

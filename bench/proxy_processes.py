"""Requests per second of ``pd-policy-proxy`` at 1, 2 and 4 processes on one port.

``--processes N`` forks N proxies that share the port (``SO_REUSEPORT``); the kernel
spreads the connections. Each run starts the proxy over the same stub workers
(``bench/http_stubs.py``) and drives it with 32 requests in flight (64 KiB images)
for a few seconds, from this process. On a machine with fewer cores than processes,
the stubs, the driver and the proxies share them: the figure is what this machine
gives, and the ratio to one process is the point.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import aiohttp
from http_proxy import _body, _port, _process, _ready, _throughput

HERE = Path(__file__).resolve().parent
PROCESSES = (1, 2, 4)
#: The generated block of docs/performance.md.
NAME = "performance-processes"


async def _measure(quick: bool) -> dict[str, Any]:
    prefill_port, decode_port = _port(), _port()
    prefill, decode = f"http://127.0.0.1:{prefill_port}", f"http://127.0.0.1:{decode_port}"
    seconds = 2.0 if quick else 4.0
    body = _body(64 * 1024)
    out: dict[str, Any] = {"cores": os.cpu_count()}
    with contextlib.ExitStack() as stack:
        stack.enter_context(_process(str(HERE / "http_stubs.py"), str(prefill_port),
                                     str(decode_port)))  # fmt: skip
        for n in PROCESSES:
            port = _port()
            argv = ["-m", "pd_policy_vllm.http.cli", "--prefill", prefill, "--decode", decode,
                    "--port", str(port), "--kv-mode", "nixl", "--decode-capability", "lm-only",
                    "--no-mrope", "--no-access-log", "--processes", str(n)]  # fmt: skip
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            with _process(*argv):
                connector = aiohttp.TCPConnector(limit=0, force_close=False)
                async with aiohttp.ClientSession(connector=connector) as session:
                    await _ready(session, url, body)
                    await _throughput(session, url, body, 1.0, 32)  # warm-up: every child answers
                    out[str(n)] = await _throughput(session, url, body, seconds, 32)
    return out


def measure(quick: bool = False) -> dict[str, Any]:
    """Requests per second at each process count; see the module docs."""
    return asyncio.run(_measure(quick))


def table(results: dict[str, Any]) -> str:
    """The figures, as a markdown table."""
    one = results["1"]
    rows = ["| proxy processes | requests/s | ÷ one process |", "|---|---|---|"]
    for n in PROCESSES:
        rate = results[str(n)]
        rows.append(f"| {n} | {rate:.0f} | {rate / one:.2f} |")
    rows.append("")
    rows.append(f"On {results['cores']} cores, shared with the stub workers and the driver.")
    return "\n".join(rows)


if __name__ == "__main__":
    print(table(measure(quick="--quick" in sys.argv)))

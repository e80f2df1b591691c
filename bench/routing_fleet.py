"""The routing bench's processes and its client: the stand-in fleet, each router, and the
open-loop replay of the trace through a router.

Every process is started in a session of its own and stopped, with whatever it started,
by its process group, on the way out of its ``with`` block.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
from routing_trace import Request

__all__ = [
    "Fleet",
    "Replayed",
    "kv_synced",
    "metrics",
    "port",
    "proxy",
    "replay",
    "smg",
    "smg_program",
    "stats",
    "stub_fleet",
    "until_ready",
]

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
Fleet = dict[str, list[str]]
#: Per request: seconds from its send to its answer, and its status (0: no answer).
Replayed = list[tuple[float, int]]


@contextlib.contextmanager
def _process(argv: Sequence[str], *, env: dict[str, str] | None = None,
             out: Any = subprocess.DEVNULL) -> Iterator[subprocess.Popen[str]]:  # fmt: skip
    process = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True, env=env)  # fmt: skip
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def port() -> int:
    """A port of 127.0.0.1 free now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        number: int = sock.getsockname()[1]
        return number


@contextlib.contextmanager
def stub_fleet(args: Sequence[str]) -> Iterator[Fleet]:
    """``tests/kv_stub.py`` with ``args``: the URLs of its prefills and decodes."""
    argv = [sys.executable, str(ROOT / "tests" / "kv_stub.py"), *args]
    with _process(argv, out=subprocess.PIPE) as process:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise RuntimeError("the stand-in fleet did not start")
        urls: Fleet = json.loads(line)
        yield urls


@contextlib.contextmanager
def proxy(fleet: Fleet, at: int, flags: Sequence[str]) -> Iterator[str]:
    """``pd-policy-proxy`` in front of ``fleet`` on port ``at``, with ``flags``."""
    # A stand-in processes nothing: what rendering once saves a prefill it cannot show, so
    # it is measured on live workers (routing_live.py), and off here.
    argv = [sys.executable, "-m", "pd_policy_vllm.http.cli", "--port", str(at), "--no-mrope",
            "--no-access-log", "--no-render-once", *flags]  # fmt: skip
    for url in fleet["prefills"]:
        argv += ["--prefill", url]
    for url in fleet["decodes"]:
        argv += ["--decode", url]
    with _process(argv):
        yield f"http://127.0.0.1:{at}"


def smg_program() -> Path:
    """SMG's gateway: this checkout's ``.venv-smg`` (``make .venv-smg/.smg``), else
    ``$PD_POLICY_SMG``."""
    local = ROOT / ".venv-smg" / "bin" / "smg"
    program = Path(os.environ.get("PD_POLICY_SMG", local))
    if not program.exists():
        raise FileNotFoundError(f"{program} is missing: make .venv-smg/.smg builds it")
    return program


@contextlib.contextmanager
def smg(fleet: Fleet, at: int) -> Iterator[str]:
    """SMG 1.13's gateway in P/D mode, ``cache_aware`` on the prefills, on port ``at``."""
    argv = [str(smg_program()), "launch", "--pd-disaggregation", "--prefill-policy",
            "cache_aware", "--decode-policy", "round_robin", "--host", "127.0.0.1",
            "--port", str(at), "--prometheus-host", "127.0.0.1", "--prometheus-port",
            str(port()), "--log-level", "warn"]  # fmt: skip
    for url in fleet["prefills"]:
        argv += ["--prefill", url]
    for url in fleet["decodes"]:
        argv += ["--decode", url]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    with _process(argv, env=env):
        yield f"http://127.0.0.1:{at}"


async def _get(session: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with session.get(url) as response:
            return await response.text() if response.status == 200 else None
    except aiohttp.ClientError:
        return None


async def until_ready(url: str, ready: str, fleet: Fleet, timeout: float = 90.0) -> None:
    """Wait until the router at ``url`` routes on ``fleet``: ``ready`` is ``smg`` (its
    readiness counts every worker healthy), ``proxy`` (it answers) or ``kv`` (and it
    follows every prefill's KV events)."""
    prefills, workers = len(fleet["prefills"]), len(fleet["prefills"]) + len(fleet["decodes"])
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if ready == "smg":
                text = await _get(session, url + "/readiness")
                if text and json.loads(text).get("healthy_workers", 0) >= workers:
                    return
            else:
                text = await _get(session, url + "/metrics")
                if text is not None and (ready == "proxy" or kv_synced(text) >= prefills):
                    return
            await asyncio.sleep(0.3)
    raise TimeoutError(f"{url} was not ready within {timeout:.0f} s")


def kv_synced(metrics: str) -> int:
    """How many prefills the proxy's ``/metrics`` say it follows in sync."""
    return len(re.findall(r"^pd_policy_kv_synced\{[^}]*\} 1\.0$", metrics, re.MULTILINE))


async def stats(fleet: Fleet) -> list[dict[str, Any]]:
    """Each prefill's own accounting (``GET /stub/stats``)."""
    async with aiohttp.ClientSession() as session:
        out = []
        for url in fleet["prefills"]:
            async with session.get(url + "/stub/stats") as response:
                out.append(await response.json())
        return out


async def metrics(url: str) -> str:
    """The router's ``/metrics`` text ("" when it has none)."""
    async with aiohttp.ClientSession() as session:
        return await _get(session, url + "/metrics") or ""


async def replay(url: str, trace: Sequence[Request], progress: str) -> Replayed:
    """Send each request of ``trace`` to ``url`` at its time, whatever the answers (open
    loop); each one's latency (send to whole answer: one token, so its TTFT) and status."""
    out: Replayed = [(0.0, 0)] * len(trace)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def send(i: int, body: dict[str, Any]) -> None:
            began = time.perf_counter()
            try:
                async with session.post(url + "/v1/chat/completions", json=body) as response:
                    await response.read()
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            out[i] = (time.perf_counter() - began, status)

        tasks = []
        start = time.perf_counter()
        for i, request in enumerate(trace):
            delay = start + request.at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i, request.body)))
            if (i + 1) % 300 == 0:
                print(f"  {progress}: {i + 1}/{len(trace)} sent", flush=True)
        await asyncio.gather(*tasks)
    return out

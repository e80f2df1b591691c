"""``make bench-fairness``: is ``GET /health`` still answered at once while a client sends
the worst requests the proxy's caps allow?

The proxy is one asyncio process: whatever it does for one request on its event loop,
every other client waits for. So this bench runs ``pd-policy-proxy`` as a process of its
own in front of the stub workers (``bench/http_stubs.py``) and a media host (this
script, ``--media-host``), drives one worst case at a time from a load process of its own
(this script, ``--load``), and meanwhile asks the proxy for ``/health`` every 20 ms from
this process, whose loop does nothing else: on a clock, whether or not the last probe
was answered, so that a stall of seconds is as many slow probes as it lasts. Each
case's ``/health`` latency p50 and p99 are reported as ratios to the same figures with
the proxy idle, measured in the same run.

The cases, each the most its caps allow:

- **items**: 128 tiny ``data:`` images in one request (``--max-media-items``), four
  clients at a time;
- **body cap**: one image filling the body cap (``--max-body-mib``, 256 MiB), one at a
  time;
- **remote**: three remote images of 64 MiB (``--media-max-bytes``) from the media host,
  which is what one request's fetches may read together (three quarters of the body
  cap), one at a time;
- **flood**: what issue #42 reported, 230 000 tiny images in 12 MiB, two at a time: past
  the cap it is now refused at the door; before, every item was served;
- **text**: 400 000 text parts in 12 MiB, one at a time: refused past
  ``--max-content-parts`` (16384), parsed and counted in a thread, since each value is a
  step of Python in the parse.

Run: ``python bench/fairness.py [--seconds S] [--label L] [--write docs/performance.md]``.
Under ``PYTHONPATH=/work/main/src`` (``--label main``) it measures the code before the
caps, for contrast; each label's figures are kept in ``bench/fairness.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Final

import aiohttp
from aiohttp import web
from http_proxy import _body, _port, _process, _ready
from measuring import percentile

HERE: Final = Path(__file__).resolve().parent
RESULTS: Final = HERE / "fairness.json"
NAME: Final = "performance-fairness"
MIB: Final = 2**20
#: Each case: what it is, and how many clients send it at once.
CASES: Final = {
    "items": ("128 tiny images (the item cap)", 4),
    "body-cap": ("one image filling the 256 MiB body cap", 1),
    "remote": ("3 remote images of 64 MiB (the fetch caps)", 1),
    "flood": ("230 000 tiny images in 12 MiB (issue #42)", 2),
    "text": ("400 000 text parts in 12 MiB (the parts cap)", 1),
}
REMOTE_ITEM: Final = 64 * MIB
_TINY: Final = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def _chat(parts: list[Any]) -> bytes:
    content = [*parts, {"type": "text", "text": "what is in the pictures?"}]
    return json.dumps({"model": "m", "max_tokens": 8,
                       "messages": [{"role": "user", "content": content}]}).encode()  # fmt: skip


def _request(case: str, media: str) -> bytes:
    """The bytes of ``case``'s request (``media``: the media host's URL)."""
    if case == "items":
        return _chat([_TINY] * 128)
    if case == "flood":
        return _chat([_TINY] * 230_000)
    if case == "text":
        return _chat([{"type": "text", "text": "a"}] * 400_000)
    if case == "remote":
        return _chat([{"type": "image_url", "image_url": {"url": f"{media}/item"}}] * 3)
    head, tail = _chat([{"type": "image_url", "image_url": {"url": "@"}}]).split(b"@")
    prefix = b"data:image/png;base64,"
    fill = 256 * MIB - len(head) - len(tail) - len(prefix)
    return head + prefix + b"A" * (fill - fill % 4) + tail


async def _load(case: str, url: str, media: str, seconds: float, clients: int) -> None:
    """Send ``case``'s request from ``clients`` clients until ``seconds`` have passed, then
    wait for those in flight; print what was answered, as JSON."""
    data = _request(case, media)
    statuses: dict[str, int] = {}
    took: list[float] = []
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=600)

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            began = time.monotonic()
            async with session.post(
                url, data=data, headers={"Content-Type": "application/json"}
            ) as response:
                await response.read()
            took.append(time.monotonic() - began)
            statuses[str(response.status)] = statuses.get(str(response.status), 0) + 1

    async with aiohttp.ClientSession(timeout=timeout) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    print(json.dumps({"statuses": statuses, "seconds_each": sorted(took)}), flush=True)


async def _media_host(port: int) -> None:
    payload = bytes(range(256)) * (REMOTE_ITEM // 256)

    async def item(request: web.Request) -> web.Response:
        return web.Response(body=payload, content_type="image/png")

    app = web.Application()
    app.router.add_get("/item", item)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def _probe(session: aiohttp.ClientSession, url: str, seconds: float) -> list[float]:
    """``GET /health`` every 20 ms for ``seconds``, whether or not the last was answered
    (a probe that waited for the last would be one sample for a stall of seconds): each
    one's latency."""
    out: list[float] = []

    async def one() -> None:
        began = time.perf_counter()
        async with session.get(url) as response:
            await response.read()
        out.append(time.perf_counter() - began)

    probes = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        probes.append(asyncio.create_task(one()))
        await asyncio.sleep(0.02)
    await asyncio.gather(*probes)
    return out


def _figures(latencies: list[float]) -> dict[str, float]:
    return {
        "probes": len(latencies),
        "p50_ms": percentile(latencies, 0.5) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "max_ms": max(latencies) * 1e3,
    }


async def _case(
    session: aiohttp.ClientSession, health: str, chat: str, media: str, case: str, seconds: float
) -> dict[str, Any]:
    argv = [sys.executable, __file__, "--load", case, chat, media, str(seconds),
            str(CASES[case][1])]  # fmt: skip
    load = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert load.stdout is not None
        ready = await asyncio.to_thread(load.stdout.readline)
        assert ready.strip() == "ready", ready
        latencies = await _probe(session, health, seconds)
        answered = json.loads(await asyncio.to_thread(load.stdout.readline))
    finally:
        with contextlib.suppress(ProcessLookupError):
            load.kill()
        load.wait(timeout=30)
    return {**_figures(latencies), **answered}


async def _measure(seconds: float) -> dict[str, Any]:
    prefill_port, decode_port, proxy_port, media_port = (_port() for _ in range(4))
    argv = ["-m", "pd_policy_vllm.http.cli", "--prefill", f"http://127.0.0.1:{prefill_port}",
            "--decode", f"http://127.0.0.1:{decode_port}", "--port", str(proxy_port),
            "--kv-mode", "nixl", "--decode-capability", "lm-only", "--no-mrope",
            "--no-access-log", "--allowed-media-domains", "127.0.0.1",
            "--media-allow-private-hosts"]  # fmt: skip
    base = f"http://127.0.0.1:{proxy_port}"
    media = f"http://127.0.0.1:{media_port}"
    with (
        _process(str(HERE / "http_stubs.py"), str(prefill_port), str(decode_port)),
        _process(__file__, "--media-host", str(media_port)),
        _process(*argv),
    ):
        # No limit on connections: a probe never waits for another's, only for the proxy.
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=600)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            await _ready(session, base + "/v1/chat/completions", _body(512))
            idle = _figures(await _probe(session, base + "/health", seconds))
            cases = {}
            for case in CASES:
                cases[case] = await _case(
                    session, base + "/health", base + "/v1/chat/completions", media, case, seconds
                )
                cases[case]["p50_ratio"] = cases[case]["p50_ms"] / idle["p50_ms"]
                cases[case]["p99_ratio"] = cases[case]["p99_ms"] / idle["p99_ms"]
                await asyncio.sleep(1)  # the proxy settles before the next case
    return {"seconds": seconds, "idle": idle, "cases": cases}


def _statuses(case: dict[str, Any]) -> str:
    return ", ".join(f"{n} of {s}" for s, n in sorted(case["statuses"].items())) or "none answered"


def table(results: dict[str, Any]) -> str:
    """Each label's figures, as markdown."""
    lines = [
        "| code | case (clients) | `/health` p50 | p99 | max | p50 ÷ idle | p99 ÷ idle "
        "| the case's answers |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, run in results.items():
        idle = run["idle"]
        lines.append(f"| {label} | idle | {idle['p50_ms']:.2f} ms | {idle['p99_ms']:.2f} ms "
                     f"| {idle['max_ms']:.1f} ms | 1 | 1 | |")  # fmt: skip
        for case, figures in run["cases"].items():
            what, clients = CASES[case]
            lines.append(
                f"| {label} | {what} ({clients}) | {figures['p50_ms']:.2f} ms "
                f"| {figures['p99_ms']:.2f} ms | {figures['max_ms']:.1f} ms "
                f"| {figures['p50_ratio']:.2f} | {figures['p99_ratio']:.2f} "
                f"| {_statuses(figures)} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="per case (8)")
    parser.add_argument("--label", default="this tree", help="the code measured")
    parser.add_argument("--write", type=Path, help="splice the table into this document")
    parser.add_argument("--load", nargs=5, metavar=("CASE", "URL", "MEDIA", "S", "N"))
    parser.add_argument("--media-host", type=int, metavar="PORT")
    args = parser.parse_args()
    if args.load:
        case, url, media, seconds, clients = args.load
        asyncio.run(_load(case, url, media, float(seconds), int(clients)))
        return 0
    if args.media_host:
        asyncio.run(_media_host(args.media_host))
        return 0
    run = asyncio.run(_measure(args.seconds))
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results[args.label] = run
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    rendered = table(results)
    print(rendered)
    if args.write is not None:
        from pd_policy.tools.tables import splice

        args.write.write_text(splice(args.write.read_text(encoding="utf-8"), NAME, rendered))
    return 0


if __name__ == "__main__":
    sys.exit(main())

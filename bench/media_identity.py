"""What media identity costs the HTTP proxy: hashing an inline item, and pinning a remote one.

Two costs, at 100 KiB and 4 MiB images, each as a ratio to something measured in the same
run:

- **identity**: the proxy's identities for a chat body with one ``data:`` URL
  (``part_identities``: one SHA-256 pass over the URL's text), against one ``memcpy``
  of the same text, and against the body's JSON parse, which the proxy does anyway;
- **pin**: fetching the item once from a media server on 127.0.0.1 and writing its
  ``data:`` URL (``pin_remote_media``), against the base64 encoding alone, which any
  proxy that sends bytes on must do.

Run alone: ``python bench/media_identity.py [--quick] [--write docs/performance.md]``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from measuring import median_seconds

from pd_policy import MediaFetchRules
from pd_policy.tools.tables import splice
from pd_policy_vllm.http.media.guard import MediaLimits, media_session
from pd_policy_vllm.http.media.pinning import pin_remote_media
from pd_policy_vllm.openai.media.identity import WorkerMedia, part_identities
from pd_policy_vllm.openai.media.parts import media_parts
from pd_policy_vllm.openai.wire.codec import loads

SIZES = {"100 KiB": 100 * 1024, "4 MiB": 4 * 2**20}


def _body(url: str) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "hi"}]
    return {"model": "m", "messages": [{"role": "user", "content": content}]}


def _identity(size: int, repeat: int) -> dict[str, float]:
    payload = bytes(range(256)) * (size // 256)
    body = _body("data:image/png;base64," + base64.b64encode(payload).decode())
    raw = json.dumps(body).encode()
    parts = media_parts(body)
    media = WorkerMedia()
    text = body["messages"][0]["content"][0]["image_url"]["url"].encode()
    identity = median_seconds(lambda: part_identities(body, parts, media), repeat=repeat)
    memcpy = median_seconds(lambda: bytearray(text), repeat=repeat)
    parse = median_seconds(lambda: loads(raw), repeat=repeat)
    return {"identity_s": identity, "identity_over_memcpy": identity / memcpy,
            "identity_over_parse": identity / parse}  # fmt: skip


async def _pin(size: int, rounds: int) -> dict[str, float]:
    payload = bytes(range(256)) * (size // 256)

    async def image(_: web.Request) -> web.Response:
        return web.Response(body=payload, content_type="image/png")

    app = web.Application()
    app.router.add_get("/a.png", image)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    body = _body(f"http://127.0.0.1:{port}/a.png")
    rules = MediaFetchRules(known=True)
    pins, encodes = [], []
    try:
        # The media server is on 127.0.0.1, which the proxy refuses by default.
        lab = MediaLimits(allow_private_hosts=True)
        async with media_session(lab) as session:
            await pin_remote_media(session, body, rules, lab)  # warm-up: the connection
            for _ in range(rounds):
                start = time.perf_counter()
                await pin_remote_media(session, body, rules, lab)
                pins.append(time.perf_counter() - start)
                start = time.perf_counter()
                base64.b64encode(payload).decode("ascii")
                encodes.append(time.perf_counter() - start)
    finally:
        await runner.cleanup()
    pin, encode = statistics.median(pins), statistics.median(encodes)
    return {"pin_s": pin, "pin_over_base64": pin / encode}


def measure(quick: bool = False) -> dict[str, Any]:
    """Both costs at every size."""
    repeat, rounds = (3, 10) if quick else (7, 40)
    return {
        label: {**_identity(size, repeat), **asyncio.run(_pin(size, rounds))}
        for label, size in SIZES.items()
    }


def table(results: dict[str, Any]) -> str:
    """The results as markdown."""
    lines = [
        "| image | identity | ÷ memcpy | ÷ JSON parse | pin (fetch + data URL) | ÷ base64 |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in results.items():
        lines.append(
            f"| {label} | {r['identity_s'] * 1e3:.3f} ms | {r['identity_over_memcpy']:.2g} "
            f"| {r['identity_over_parse']:.2g} | {r['pin_s'] * 1e3:.2f} ms "
            f"| {r['pin_over_base64']:.2g} |"
        )
    return "\n".join(lines)


#: The generated block's name in ``docs/performance.md``.
NAME = "performance-media"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--write", type=Path, help="splice the table into this document")
    args = parser.parse_args()
    rendered = table(measure(args.quick))
    print(rendered)
    if args.write is not None:
        text = splice(args.write.read_text(encoding="utf-8"), NAME, rendered)
        args.write.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

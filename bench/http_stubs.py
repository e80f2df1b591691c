"""Stub vLLM workers for the proxy benchmark: answer at once, count what decode receives.

Run: ``python bench/http_stubs.py PREFILL_PORT DECODE_PORT``. The prefill stub
answers a chat request with 4096 prompt ids and KV parameters; the decode stub
with an 8-token completion, after holding it ``bench_hold`` seconds (a body field)
when asked.
``GET /stats`` on the decode stub gives the bytes of every body it received.
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

PROMPT_IDS = list(range(1000, 5096))
RECEIVED: list[int] = []


def _compact(value: object) -> str:
    # As vLLM's server writes its answers (Starlette's JSONResponse: no whitespace).
    return json.dumps(value, separators=(",", ":"))


async def prefill(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response(
        {
            "id": "p",
            "prompt_token_ids": PROMPT_IDS,
            # A complete NIXL handoff: the proxies here run --kv-mode nixl.
            "kv_transfer_params": {
                "do_remote_prefill": True,
                "remote_engine_id": "p",
                "remote_block_ids": [0],
                "remote_host": "127.0.0.1",
                "remote_port": 1,
            },
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"}}],
            "usage": {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": 1},
        },
        dumps=_compact,
    )


async def decode(request: web.Request) -> web.Response:
    body = await request.read()
    RECEIVED.append(len(body))
    # Both proxies pass unknown body fields on to decode. Parsed only when present, so
    # that the stub's own cost does not depend on what a proxy sends it.
    if b'"bench_hold"' in body:
        await asyncio.sleep(float(json.loads(body)["bench_hold"]))
    return web.json_response(
        {
            "id": "d",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "a b c d"},
                         "finish_reason": "length", "token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}],
            "usage": {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": 8},
        },
        dumps=_compact,
    )  # fmt: skip


async def stats(request: web.Request) -> web.Response:
    received = list(RECEIVED)
    RECEIVED.clear()
    return web.json_response({"received": received})


async def health(request: web.Request) -> web.Response:
    # A fleet router probes its workers: the stubs are healthy, as vllm serve is.
    return web.Response(status=200)


async def main(prefill_port: int, decode_port: int) -> None:
    prefill_app, decode_app = (
        web.Application(client_max_size=2**30),
        web.Application(client_max_size=2**30),
    )
    prefill_app.router.add_post("/v1/chat/completions", prefill)
    decode_app.router.add_post("/v1/chat/completions", decode)
    decode_app.router.add_get("/stats", stats)
    for app in (prefill_app, decode_app):
        app.router.add_get("/health", health)
    for app, port in ((prefill_app, prefill_port), (decode_app, decode_port)):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))

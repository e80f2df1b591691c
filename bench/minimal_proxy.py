"""The proxy every P/D deployment starts from, for comparison: the original body to both
legs, on the same libraries as pd-policy's (aiohttp client and server, msgspec for JSON).

Run: ``python bench/minimal_proxy.py PORT PREFILL_URL DECODE_URL [one-copy]``. It tags
the prefill for NIXL, caps it at one token, and sends the original body, images
included, with the returned KV parameters to decode, as vLLM's toy proxy does.

With ``one-copy`` it is the reference the policy's own cost is read against: the same
proxy, whose decode leg keeps only each message's text parts. It sends the image
once, as pd-policy does, and does none of the policy's work (no identity, no decision,
no check, no salt): the minimal proxy less it is what the second copy of the image
costs, and pd-policy less it is what the policy costs.
"""

from __future__ import annotations

import sys
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

JSON = {"Content-Type": "application/json"}


def _text_only(messages: Any) -> Any:
    # Trusts the body's shape: a reference, not a proxy to deploy.
    return [
        {**m, "content": [p for p in m["content"] if p.get("type") == "text"]}
        if isinstance(m.get("content"), list)
        else m
        for m in messages
    ]


def app(prefill: str, decode: str, *, one_copy: bool = False) -> web.Application:
    session: dict[str, aiohttp.ClientSession] = {}

    async def lifetime(_: web.Application) -> Any:
        async with aiohttp.ClientSession() as client:
            session["client"] = client
            yield

    async def chat(request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read())
        client = session["client"]
        tag = {"do_remote_decode": True, "do_remote_prefill": False}
        first = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": tag}
        async with client.post(
            f"{prefill}/v1/chat/completions", data=msgspec.json.encode(first), headers=JSON
        ) as response:
            kv = msgspec.json.decode(await response.read()).get("kv_transfer_params")
        if one_copy:
            body = {**body, "messages": _text_only(body["messages"])}
        second = msgspec.json.encode({**body, "kv_transfer_params": kv})
        async with client.post(
            f"{decode}/v1/chat/completions", data=second, headers=JSON
        ) as response:
            return web.Response(
                body=await response.read(), status=response.status, content_type="application/json"
            )

    application = web.Application(client_max_size=2**30)
    application.router.add_post("/v1/chat/completions", chat)
    application.cleanup_ctx.append(lifetime)
    return application


if __name__ == "__main__":
    port, prefill_url, decode_url = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    one_copy = sys.argv[4:] == ["one-copy"]
    web.run_app(app(prefill_url, decode_url, one_copy=one_copy), host="127.0.0.1", port=port,
                print=None, access_log=None)  # fmt: skip

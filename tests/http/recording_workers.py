"""A stand-in ``vllm serve`` worker for every route the proxy calls, recording each call whole.

It answers as vLLM 0.32 does in each role, well formed and 200 (so a 5xx the client sees is
the proxy's own): chat, completions and responses legs (a prefill leg, one token and no
stream, returns the expanded ids and a KV handoff; any other is a decode, whole or
streamed), and the scale-out routes of the M-RoPE metadata path and E/P/D (a render, an
encode, a generate prefill or decode, a derender). Each call is recorded as its route, its
headers and its body's bytes: what a worker received, for tests to search.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import attrs
from aiohttp import web

from pd_policy_vllm.openai.plan.scale_out import DERENDER, GENERATE, RENDER

__all__ = ["RETURNED", "Call", "Recorder", "serve"]

#: The handoff every prefill leg returns (complete for NIXL).
RETURNED = {"do_remote_prefill": True, "remote_engine_id": "p0", "remote_block_ids": [0],
            "remote_host": "127.0.0.1", "remote_port": 1, "transfer_id": "t"}  # fmt: skip
_IDS = list(range(7, 47))


@attrs.frozen
class Call:
    """One call a worker received."""

    route: str
    #: Lower-cased names.
    headers: dict[str, str]
    raw: bytes

    @property
    def body(self) -> Any:
        return json.loads(self.raw)


def _images(body: Any) -> int:
    return json.dumps(body).count('"image_url"')


def _render(body: Any) -> dict[str, Any]:
    count = max(_images(body), 1)
    features = {
        "mm_hashes": {"image": [f"{i:064x}" for i in range(1, count + 1)]},
        "mm_placeholders": {"image": [{"offset": 2 + 4 * i, "length": 4} for i in range(count)]},
        "kwargs_data": {"image": [f"PIXELS{i}" for i in range(count)]},
        "mm_metadata": {"image": [f"GRID{i}" for i in range(count)]},
    }
    sampling = {"max_tokens": 4, "temperature": 0.0, "n": 1}
    return {"request_id": "chatcmpl-r", "token_ids": _IDS, "features": features, "model": "m",
            "stream": bool(body.get("stream")), "cache_salt": body.get("cache_salt"),
            "sampling_params": sampling, "kv_transfer_params": None}  # fmt: skip


def _generate(body: Any) -> dict[str, Any]:
    kv = body.get("kv_transfer_params")
    if kv is None and "ec_transfer_params" not in body:  # an encode leg, in E/P/D
        hashes = body["features"]["mm_hashes"]["image"]
        outputs = {h: {"item_indices": [i], "metadata": {"image_grid_thw": [[1, 2, 2]]}}
                   for i, h in enumerate(hashes)}  # fmt: skip
        return {"request_id": "r", "choices": [], "ec_transfer_params": outputs}
    if isinstance(kv, dict) and kv.get("do_remote_decode"):  # a prefill leg
        return {"prompt_token_ids": body["token_ids"], "kv_transfer_params": RETURNED,
                "choices": []}  # fmt: skip
    return {"choices": [{"index": 0, "token_ids": [5, 6], "finish_reason": "stop"}]}


def _is_prefill(body: Any) -> bool:
    one = body.get("max_tokens") == 1 or body.get("max_completion_tokens") == 1
    return one and body.get("stream") is False and body.get("return_token_ids") is True


@attrs.define
class Recorder:
    """The stand-in; ``handoff``: whether a prefill leg returns a KV handoff."""

    handoff: bool = True
    calls: list[Call] = attrs.field(factory=list)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=2**30)
        app.router.add_post("/{route:.*}", self.answer)
        return app

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        route = request.path
        headers = {name.lower(): value for name, value in request.headers.items()}
        self.calls.append(Call(route, headers, raw))
        body = json.loads(raw)
        if route == RENDER:
            return web.json_response(_render(body))
        if route == GENERATE:
            answer = _generate(body)
        elif route == DERENDER and body.get("stream"):
            # A chunk of a stream is derendered whole, as JSON (vLLM's derender route).
            chunk = {"chunk": {"choices": [{"delta": {"content": "x"}}]}, "stream_state": 1}
            return web.json_response(chunk)
        elif route == DERENDER:
            answer = {"object": "chat.completion", "choices": []}
        elif _is_prefill(body):
            handoff = {"kv_transfer_params": RETURNED} if self.handoff else {}
            if route == "/v1/completions":
                return web.json_response({"choices": [{"prompt_token_ids": _IDS}], **handoff})
            return web.json_response({"prompt_token_ids": _IDS, **handoff})
        else:
            answer = {"object": "answer", "choices": [{"index": 0, "text": "ok"}]}
        if not body.get("stream"):
            return web.json_response(answer)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(b"data: " + json.dumps(answer).encode() + b"\n\ndata: [DONE]\n\n")
        return out


@contextlib.asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """``app`` on 127.0.0.1, port 0; its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()

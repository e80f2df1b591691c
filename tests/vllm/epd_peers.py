"""E/P/D fleets of real ``vllm serve`` workers, and an encoder stand-in for the faults a
real encoder cannot be made to show.

A fleet is four servers of one tiny model, on 127.0.0.1, stopped by process id:
an encoder-only worker (``ec_producer``), a prefill worker that consumes its cache
(``ec_consumer``) and produces KV, a ``--language-model-only`` decode worker that
consumes KV, and a plain full-vision server, the baseline. The encoder cache lives
in a fresh directory per fleet: vLLM's example connector looks items up by hash on
disk and ignores the parameters, so a stale store would answer silently.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import attrs
from aiohttp import web
from http_peers import InProcessProxy, data_url, http_json, vllm_server
from live_engines import connector
from servers import free_port, running
from tiny_models import TinyModel

from pd_policy import EncoderCacheRole, Support, WorkerCapability
from pd_policy_vllm import ec_transfer_config
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.proxy import Proxy

__all__ = ["EncoderStandIn", "EpdFleet", "answer", "chat_body", "epd_fleet"]


def chat_body(picture: Any, text: str) -> dict[str, Any]:
    """A greedy chat request for an image and a text, asking for ids and logprobs."""
    content = [{"type": "image_url", "image_url": {"url": data_url(picture)}},
               {"type": "text", "text": text}]  # fmt: skip
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 6,
            "temperature": 0, "logprobs": True, "return_token_ids": True}  # fmt: skip


def answer(url: str, request: dict[str, Any]) -> tuple[list[int], list[float]]:
    """The tokens and their logprobs ``url`` answers ``request`` with (a 200, or it fails)."""
    status, reply = http_json(f"{url}/v1/chat/completions", request)
    assert status == 200, reply
    choice = reply["choices"][0]
    return choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]


@attrs.frozen
class EpdFleet:
    encoder: str
    prefill: str
    decode: str
    baseline: str
    #: The proxy in front of them, recording every leg it sends.
    proxy: InProcessProxy
    #: What the proxy knows of them: the prefill, decode and encoder workers.
    workers: tuple[HttpWorker, HttpWorker, HttpWorker]
    mrope: bool
    #: The encoder cache's directory: one directory per item hash.
    store: Path

    def proxy_with(self, encoder: str) -> Proxy:
        """A proxy of this fleet whose encoder is at ``encoder`` (a stand-in, say)."""
        prefill, decode, real = self.workers
        stand_in = HttpWorker(encoder, real.capability, renders=True)
        return Proxy(prefill, [decode], mrope=self.mrope, encoder=stand_in)


@contextmanager
def epd_fleet(
    model: TinyModel, root: Path, *, mrope: bool, limits: dict[str, int]
) -> Iterator[EpdFleet]:
    """Start the four servers of ``model`` (logs under ``root``) and a recording proxy."""
    root.mkdir(parents=True, exist_ok=True)
    store, transfers = root / "encoder-cache", root / "transfers"
    scale_out = ("--enable-scale-out",)

    def ec(role: EncoderCacheRole) -> tuple[str, ...]:
        return ("--ec-transfer-config", json.dumps(ec_transfer_config(role, store)))

    e, e_url = vllm_server("encoder", model, root, limits=limits,
                           extra=(*scale_out, *ec(EncoderCacheRole.PRODUCER)))  # fmt: skip
    p, p_url = vllm_server(
        "prefill", model, root, kv_config=connector("kv_producer", transfers), limits=limits,
        extra=(*scale_out, *ec(EncoderCacheRole.CONSUMER)),
    )  # fmt: skip
    d, d_url = vllm_server(
        "decode", model, root, language_model_only=True,
        kv_config=connector("kv_consumer", transfers), extra=scale_out,
    )  # fmt: skip
    b, b_url = vllm_server("baseline", model, root, limits=limits)
    capability = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.from_bool(mrope))
    workers = (
        HttpWorker(p_url, WorkerCapability(encoder_cache=EncoderCacheRole.CONSUMER), renders=True),
        HttpWorker(d_url, capability, renders=True),
        HttpWorker(e_url, WorkerCapability(encoder_cache=EncoderCacheRole.PRODUCER), renders=True),
    )
    proxy = Proxy(workers[0], [workers[1]], mrope=mrope, encoder=workers[2])
    with running([e, p, d, b]), InProcessProxy(proxy) as recording:
        yield EpdFleet(e_url, p_url, d_url, b_url, recording, workers, mrope, store)


class EncoderStandIn:
    """An encoder that forwards to a real one and then edits its answer (``edit``): for the
    answers a real encoder does not give (an item missing, another hash)."""

    def __init__(self, encoder: str, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        self.encoder, self.edit = encoder, edit
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    async def _forward(self, request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as session, session.post(
            self.encoder + request.path, data=await request.read(),
            headers={"Content-Type": "application/json"},
        ) as answer:  # fmt: skip
            body = await answer.json()
        if request.path.endswith("/generate"):
            body = self.edit(body)
        return web.json_response(body, status=answer.status)

    async def _start(self) -> None:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def __enter__(self) -> EncoderStandIn:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

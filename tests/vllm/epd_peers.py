"""E/P/D over a model's shared fleet of real ``vllm serve`` workers (see
[`http_fleets`][]), and an encoder stand-in for the faults a real encoder cannot be made
to show.

The E/P/D chain is the fleet's encoder (``ec_producer``), its E/P/D prefill, which
consumes the encoder's cache and produces KV, and its ``--language-model-only``
decode, which consumes KV; the fleet's plain prefill is the full-vision baseline.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import attrs
from aiohttp import web
from http_fleets import HttpFleet
from http_peers import InProcessProxy, ThreadedSite, data_url, http_json
from nixl_peers import nixl_config

from pd_policy import EncoderCacheRole, KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.workers import prefill_kv_from_config

#: The live servers hand KV over with pd-policy's TransferConnector (unless the fleet's
#: ``nixl``: vLLM's NixlConnector).
TRANSFER_KV = PrefillKv(KvConnectorMode.TRANSFER)

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


def _prefill_kv(servers: HttpFleet) -> PrefillKv:
    # How the E/P/D prefill hands KV over, as the proxy would read it from its server.
    if not servers.nixl:
        return TRANSFER_KV
    config = {"kv_transfer_config": nixl_config("kv_producer")}
    return prefill_kv_from_config(config, servers.epd_prefill)


@contextmanager
def epd_fleet(servers: HttpFleet, *, mrope: bool) -> Iterator[EpdFleet]:
    """The E/P/D chain of ``servers`` behind a recording proxy; ``mrope``: the decode takes
    the items' metadata (it needs the fleet's scale-out routes)."""
    if mrope and not servers.scale_out:
        raise ValueError("the metadata path needs a fleet with --enable-scale-out")
    consumer, producer = EncoderCacheRole.CONSUMER, EncoderCacheRole.PRODUCER
    capability = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.from_bool(mrope))
    workers = (
        HttpWorker(
            servers.epd_prefill,
            WorkerCapability(encoder_cache=consumer),
            renders=True,
            kv=_prefill_kv(servers),
        ),
        HttpWorker(servers.decode, capability, renders=servers.scale_out),
        HttpWorker(servers.encoder, WorkerCapability(encoder_cache=producer), renders=True),
    )
    proxy = Proxy(workers[0], [workers[1]], mrope=mrope, encoder=workers[2])
    with InProcessProxy(proxy) as recording:
        yield EpdFleet(
            servers.encoder, servers.epd_prefill, servers.decode, servers.baseline, recording,
            workers, mrope, servers.store,
        )  # fmt: skip


class EncoderStandIn(ThreadedSite):
    """An encoder that forwards to a real one and then edits its answer (``edit``): for the
    answers a real encoder does not give (an item missing, another hash)."""

    def __init__(self, encoder: str, edit: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        super().__init__()
        self.encoder, self.edit = encoder, edit

    def app(self) -> web.Application:
        app = web.Application(client_max_size=256 * 2**20)
        app.router.add_post("/{tail:.*}", self._forward)
        return app

    async def _forward(self, request: web.Request) -> web.Response:
        async with aiohttp.ClientSession() as session, session.post(
            self.encoder + request.path, data=await request.read(),
            headers={"Content-Type": "application/json"},
        ) as answer:  # fmt: skip
            body = await answer.json()
        if request.path.endswith("/generate"):
            body = self.edit(body)
        return web.json_response(body, status=answer.status)

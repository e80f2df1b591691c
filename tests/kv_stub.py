"""Stand-in ``vllm serve`` workers with a prefix cache and KV events, for KV-routing tests
and ``make bench-routing``.

A prefill stand-in serves what a router reads of a vLLM prefill: ``/health``,
``/v1/models`` (``owned_by: vllm``, so SMG's gateway runs its sequential P/D),
``/server_info`` as in vLLM's development mode (NIXL producer, prefix caching, KV events
on vLLM's own ``ZmqEventPublisher``, bound on ``tcp://*:PORT`` with a replay socket),
the scale-out render routes (the toy tokenizer's prompt,
[`kv_stub_prompt`][kv_stub_prompt], with each image's processed tensor unless the body
asks ``mm_payload: "none"``, as vLLM does), and the chat, completions and scale-out
generate routes (a rendered request: an item without its tensors is refused, since vLLM
would read it as cached), which it serves one request at a time: each waits for the
ones before it, then takes ``base + per_token x`` its uncached tokens (asleep), then its
blocks enter the bounded LRU cache ([`kv_stub_cache`][kv_stub_cache]) and a batch of
events says what was stored and evicted. Its answer is a vLLM prefill's:
``prompt_token_ids`` when asked, the NIXL ``kv_transfer_params`` when asked, and
``usage.prompt_tokens_details.cached_tokens``. A decode stand-in (language-model-only,
NIXL consumer) answers at once.

Each stand-in records every request it served
([`Record`][kv_stub_worker.Record]: prompt and cached tokens, queue wait, service time) and
counts the renders it was asked for (an empty body, the proxy's probe of the route, is
not one), keeping the last one's body (``last_render``), and the generate requests
(``generates``, ``last_generate``); ``render_override`` makes it answer every render
with a status and JSON of the test's. ``GET /stub/stats`` gives the
records, ``POST /stub/reset`` drops them and the cache, publishing ``AllBlocksCleared``.

In a test: ``async with kv_stubs(2, 1, StubConfig(...)) as fleet: fleet.prefills[0].url``.
As a process: ``python tests/kv_stub.py --prefills 4 --decodes 1 ...`` prints one JSON
line (``{"prefills": [urls], "decodes": [urls]}``) and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from collections.abc import AsyncIterator

import attrs
from aiohttp import web

from kv_stub_worker import KvStub, Record, StubConfig

__all__ = ["KvStub", "Record", "StubConfig", "StubFleet", "kv_stubs"]


@attrs.define
class StubFleet:
    """The stand-ins of one fleet."""

    prefills: list[KvStub]
    decodes: list[KvStub]


@contextlib.asynccontextmanager
async def kv_stubs(
    prefills: int, decodes: int, config: StubConfig | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[StubFleet]:
    """``prefills`` and ``decodes`` stand-ins served on free ports of ``host`` in the running
    loop, named ``p0``... and ``d0``...; stopped, sockets closed, on exit."""
    config = config or StubConfig()
    fleet = StubFleet([KvStub(f"p{i}", "prefill", config) for i in range(prefills)],
                      [KvStub(f"d{i}", "decode", config) for i in range(decodes)])  # fmt: skip
    runners: list[web.AppRunner] = []
    try:
        for stub in fleet.prefills + fleet.decodes:
            stub.start()
            runner = web.AppRunner(stub.app(), access_log=None)
            runners.append(runner)
            await runner.setup()
            site = web.TCPSite(runner, host, 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            stub.url = f"http://{host}:{port}"
        yield fleet
    finally:
        for runner in runners:
            await runner.cleanup()
        for stub in fleet.prefills + fleet.decodes:
            stub.close()


async def _serve(args: argparse.Namespace) -> None:
    config = StubConfig(
        block_size=args.block_size,
        capacity=args.capacity,
        image_tokens=args.image_tokens,
        base=args.base_ms / 1e3,
        per_token=args.per_token_ms / 1e3,
        tensor_bytes=args.tensor_bytes,
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    async with kv_stubs(args.prefills, args.decodes, config) as fleet:
        urls = {"prefills": [s.url for s in fleet.prefills],
                "decodes": [s.url for s in fleet.decodes]}  # fmt: skip
        print(json.dumps(urls), flush=True)
        await stop.wait()


def main() -> None:
    """Serve a fleet of stand-ins until SIGTERM or SIGINT (see the module docs)."""
    cli = argparse.ArgumentParser(description="Stand-in vllm serve workers with KV events.")
    add = cli.add_argument
    add("--prefills", type=int, default=4)
    add("--decodes", type=int, default=1)
    add("--block-size", type=int, default=16)
    add("--capacity", type=int, default=4096, help="blocks each prefill's cache holds")
    add("--image-tokens", type=int, default=64, help="placeholder tokens an image")
    add("--base-ms", type=float, default=0.0, help="milliseconds a prefill request")
    add("--per-token-ms", type=float, default=0.0, help="milliseconds an uncached token")
    add("--tensor-bytes", type=int, default=0, help="bytes of a render's tensor an image")
    asyncio.run(_serve(cli.parse_args()))


if __name__ == "__main__":
    main()

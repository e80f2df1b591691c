"""The proxy's body reader against a real aiohttp server and client: its own read of the
declared length when it can, ``request.read()`` otherwise, the same bytes either way."""

from __future__ import annotations

import asyncio
import gzip
import os
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from pd_policy import PolicyError
from pd_policy_vllm.http.front_door import FrontDoor, client_body, error_response

LIMIT = 1 << 20
READ = web.RequestKey("read", bool)


@pytest.fixture(autouse=True)
def _reads(monkeypatch: pytest.MonkeyPatch) -> None:
    # Which path read the body: aiohttp's read() says so in a header of the echo.
    read = web.BaseRequest.read

    async def counted(self: web.BaseRequest) -> bytes:
        self[READ] = True
        return await read(self)

    monkeypatch.setattr(web.BaseRequest, "read", counted)


async def _echo(request: web.Request) -> web.Response:
    try:
        body = await client_body(request, FrontDoor(max_body=LIMIT))
    except PolicyError as exc:
        return error_response(exc)
    kind = "read()" if request.get(READ) else "own"
    return web.Response(body=bytes(body), headers={"X-Kind": f"{kind} {type(body).__name__}"})


async def _serve_and_post(**kwargs: object) -> tuple[int, str, bytes]:
    app = web.Application(client_max_size=LIMIT)
    app.router.add_post("/", _echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"http://127.0.0.1:{port}/", **kwargs) as response,  # type: ignore[arg-type]
        ):
            return response.status, response.headers.get("X-Kind", ""), await response.read()
    finally:
        await runner.cleanup()


def _post(**kwargs: object) -> tuple[int, str, bytes]:
    return asyncio.run(_serve_and_post(**kwargs))


@pytest.mark.parametrize("size", [0, 1, 65536, 700_001])
def test_a_body_of_declared_length_is_read_whole_by_its_own_reader(size: int) -> None:
    data = os.urandom(size)
    status, kind, echoed = _post(data=data)
    assert (status, echoed) == (200, data)
    assert kind == "own bytes"


def test_a_chunked_body_is_read_by_aiohttp() -> None:
    data = os.urandom(300_000)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(data), 65536):
            yield data[start : start + 65536]

    status, kind, echoed = _post(data=chunks())  # runs in _post's loop
    assert (status, echoed, kind) == (200, data, "read() bytes")


def test_a_compressed_body_is_read_decompressed() -> None:
    data = b'{"messages": []}' * 1000
    headers = {"Content-Encoding": "gzip"}
    status, kind, echoed = _post(data=gzip.compress(data), headers=headers)
    assert (status, echoed, kind) == (200, data, "read() bytes")


def test_a_body_over_the_limit_is_a_413_before_it_is_read() -> None:
    status, _, body = _post(data=os.urandom(LIMIT + 1))
    assert status == 413 and b"pd_body_too_large" in body

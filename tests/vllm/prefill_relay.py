"""A relay in front of a prefill worker: a stand-in for the network between the proxy and the
prefill, which a test makes slow or has the prefill die behind.

Every request goes through unchanged, its answer back unchanged; a prefill leg's (a POST
whose ``kv_transfer_params`` asks for ``do_remote_decode``) can be held back
(``hold``: the prefill's answer reaches the proxy late, past its lease on the KV), or be
the last the prefill gives (``kill_after``: once that many prefill legs have been
answered, the prefill's process group is killed, by its id, and only then do their
answers go on: the decode then reads the KV of a prefill that is gone). What each prefill
leg answered is kept (``answers``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import Any, Final, Self

import aiohttp
from aiohttp import web
from described import stand_in
from http_peers import ThreadedSite
from servers import Server

__all__ = ["PrefillRelay"]

#: Headers of one hop, which the relay's own connections set.
_HOP: Final = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})


def _prefill_leg(raw: bytes) -> bool:
    try:
        body: Any = json.loads(raw)
    except ValueError:
        return False
    kv = body.get("kv_transfer_params") if isinstance(body, dict) else None
    return isinstance(kv, dict) and kv.get("do_remote_decode") is True


class PrefillRelay(ThreadedSite):
    """The relay to the ``prefill`` server (its ``url`` once entered)."""

    def __init__(self, prefill: Server) -> None:
        super().__init__()
        self.prefill = prefill
        #: Seconds each prefill leg's answer is held back before it goes on.
        self.hold = 0.0
        #: Kill the prefill once this many more prefill legs have been answered (0: never).
        self.kill_after = 0
        #: What each prefill leg answered (its JSON), in order.
        self.answers: list[Any] = []
        self._session: aiohttp.ClientSession | None = None
        self._answered = 0
        self._killed: asyncio.Event | None = None

    def __enter__(self) -> Self:
        super().__enter__()
        stand_in(self.url, self.prefill)  # a proxy in front of the relay reads the prefill's
        return self

    def arm_kill(self, after: int) -> None:
        """Kill the prefill once ``after`` more prefill legs have been answered."""
        self._answered, self.kill_after = 0, after

    def app(self) -> web.Application:
        app = web.Application(client_max_size=2**30)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        app.on_cleanup.append(self._close)
        return app

    async def _close(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def _relay(self, request: web.Request) -> web.Response:
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
            self._killed = asyncio.Event()
        raw = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with self._session.request(
            request.method, self.prefill.url + request.path_qs, data=raw, headers=headers
        ) as answer:
            body = await answer.read()
            status, reply = answer.status, answer.headers
        out = {k: v for k, v in reply.items() if k.lower() not in _HOP}
        if _prefill_leg(raw):
            self.answers.append(json.loads(body) if status == 200 else None)
            await self._before_answering()
        return web.Response(status=status, body=body, headers=out)

    async def _before_answering(self) -> None:
        if self.kill_after:
            assert self._killed is not None
            self._answered += 1
            if self._answered == self.kill_after:
                os.killpg(self.prefill.pid, signal.SIGKILL)
                await asyncio.to_thread(self.prefill.process.wait)  # type: ignore[union-attr]
                self.kill_after = 0
                self._killed.set()
            await self._killed.wait()
        if self.hold:
            await asyncio.sleep(self.hold)

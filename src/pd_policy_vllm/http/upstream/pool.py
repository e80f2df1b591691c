"""One worker origin's connections: the idle ones kept alive, and the slots of the legs it
serves. A leg past the origin's ``max_connections`` waits for a slot, in order, and fails
as unreachable when none frees within the queue timeout; a leg cancelled while it waits,
or as it is handed a slot, passes the slot on (none is ever lost)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from .connection import Connection
from .errors import UpstreamUnreachable
from .limits import Limits

__all__ = ["Pool"]


class Pool:
    """One worker origin's idle connections, and the slots of the legs it is serving."""

    __slots__ = ("busy", "idle", "queued", "waiters")

    def __init__(self) -> None:
        self.idle: list[tuple[float, Connection]] = []
        self.busy = 0
        self.waiters: deque[asyncio.Future[None]] = deque()
        self.queued = 0  # legs that waited for a slot, ever

    async def take(self, limits: Limits) -> None:
        if self.busy < limits.max_connections and not self.waiters:
            self.busy += 1
            return
        self.queued += 1
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self.waiters.append(waiter)
        timer = loop.call_later(limits.queue_timeout, _expire, waiter)
        try:
            await waiter  # the slot is handed over by ``give``, ``busy`` unchanged
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self.give()  # handed a slot as it was cancelled: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self.waiters.remove(waiter)
            raise
        finally:
            timer.cancel()

    def give(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.busy -= 1


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamUnreachable("the worker's connections are all in use"))

"""The processes of one proxy (``--processes N``), answering a scrape as one.

The parent makes a directory only its user may enter; each process serves its own
metrics on a Unix socket there, named by its slot (``0`` to ``N-1``; a process
restarted takes the slot of the one that died). The process that takes a scrape renders
its own, asks every sibling's socket for theirs, and merges them, each sample labelled
with its process's slot ([`metrics_merge`][pd_policy_vllm.http.fleet.metrics_merge]). A
sibling that does not answer in time (one restarting) is left out, and
``pd_policy_processes`` says how many processes the answer holds. Nothing on these
sockets is reachable from the network, and nothing there needs a key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

from pd_policy_vllm.http.aio import aiohttp, web
from pd_policy_vllm.http.fleet.metrics_merge import merge

__all__ = ["PROCESSES_HELP", "SIBLING_TIMEOUT", "Siblings"]

_log = logging.getLogger("pd_policy_vllm.http")

#: Seconds a sibling has to answer a scrape's question.
SIBLING_TIMEOUT: Final = 2.0
_ROUTE: Final = "/metrics"
#: The help of ``pd_policy_processes``, the one metric a merged scrape adds.
PROCESSES_HELP: Final = "With --processes N: the processes whose metrics this answer holds"


class Siblings:
    """This process's place among the proxy's processes: the directory of their sockets
    (``directory``) and its own slot."""

    def __init__(self, directory: Path, slot: int) -> None:
        self.directory, self.slot = directory, slot

    @property
    def socket(self) -> Path:
        return self.directory / f"{self.slot}.sock"

    @contextlib.asynccontextmanager
    async def serving(self, render: Callable[[], bytes]) -> AsyncIterator[None]:
        """Serve ``render``'s metrics (this process's own) on this process's socket for
        the duration of the block."""

        async def own(request: web.Request) -> web.Response:
            return web.Response(body=render())

        app = web.Application()
        app.router.add_get(_ROUTE, own)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            self.socket.unlink(missing_ok=True)
            await web.UnixSite(runner, str(self.socket)).start()
            yield
        finally:
            await runner.cleanup()
            self.socket.unlink(missing_ok=True)

    async def _theirs(self, socket: Path) -> tuple[str, bytes | None]:
        timeout = aiohttp.ClientTimeout(total=SIBLING_TIMEOUT)
        connector = aiohttp.UnixConnector(path=str(socket))
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.get(f"http://process{_ROUTE}") as response,
            ):
                ok = response.status == 200
                return socket.stem, await response.read() if ok else None
        except (aiohttp.ClientError, TimeoutError, OSError):
            return socket.stem, None  # gone, or restarting: its series come back with it

    async def metrics(self, own: bytes) -> bytes:
        """``own`` (this process's metrics) and every sibling's that answers, merged."""
        sockets = [s for s in sorted(self.directory.glob("*.sock")) if s != self.socket]
        theirs = await asyncio.gather(*(self._theirs(s) for s in sockets))
        texts = {str(self.slot): own, **{slot: t for slot, t in theirs if t is not None}}
        count = f"# HELP pd_policy_processes {PROCESSES_HELP}\n"
        count += f"# TYPE pd_policy_processes gauge\npd_policy_processes {len(texts)}\n"
        try:
            return merge(texts) + count.encode()
        except ValueError:  # a sibling's answer not in the format: its own alone
            _log.warning("a process's metrics could not be read; this one's alone")
            return own

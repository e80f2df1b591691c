"""Running the proxy: its listener in one process or in several on one port, and what a
signal does to it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable

from pd_policy_vllm.http.aio import access_logger, web
from pd_policy_vllm.http.client_gate import GatedRunner
from pd_policy_vllm.http.proxy import Proxy

__all__ = ["processes", "serve"]

_log = logging.getLogger("pd_policy_vllm.http")


async def _serve(args: argparse.Namespace, proxy: Proxy) -> None:
    # web.run_app's own runner, made where nothing reaches its sites' protocol factory,
    # cannot have the client gate in front of each connection: this is run_app's run,
    # with a GatedRunner. The signals end the wait, not the loop, so that the runner's
    # cleanup drains the requests in flight before anything is cancelled. SIGTERM first
    # turns /ready 503 and keeps serving for the pre-stop delay (a balancer takes the
    # proxy out meanwhile); SIGINT (a terminal's ^C) stops at once.
    loop, stopping = asyncio.get_running_loop(), asyncio.Queue[int]()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.put_nowait, signum)
    runner = GatedRunner(
        proxy.app(),
        proxy.front_door,
        handler_cancellation=True,
        access_log=access_logger if args.access_log else None,
        shutdown_timeout=args.drain_seconds,
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, args.port, reuse_port=args.processes > 1)
        await site.start()
        for address in runner.addresses:  # port 0 is the kernel's choice: say which
            _log.info("listening on %s port %d", address[0], address[1])
        signum = await stopping.get()
        proxy.lifecycle.draining = True
        if signum == signal.SIGTERM and args.pre_stop_seconds > 0:
            _log.info("SIGTERM: not ready; serving %gs more, then draining for %gs",
                      args.pre_stop_seconds, args.drain_seconds)  # fmt: skip
            with contextlib.suppress(TimeoutError):  # a second signal cuts it short
                await asyncio.wait_for(stopping.get(), args.pre_stop_seconds)
    finally:
        await runner.cleanup()


def serve(args: argparse.Namespace, proxy: Proxy) -> None:
    """Serve ``proxy`` on ``args.host`` and ``args.port`` until SIGTERM or SIGINT, then
    drain ([`lifecycle`][pd_policy_vllm.http.lifecycle]): after SIGTERM, ``/ready`` 503 at
    once and new requests served for ``args.pre_stop_seconds``; then the listener closes
    and the requests in flight finish, up to ``args.drain_seconds``."""
    asyncio.run(_serve(args, proxy))


def processes(args: argparse.Namespace, make: Callable[[], Proxy]) -> int:
    """Serve ``args.processes`` proxies, each made by ``make`` in a process of its own, on
    one port; the exit status of the first that failed, else 0."""
    # N processes on one port (SO_REUSEPORT): the kernel spreads the connections. The
    # parent forwards SIGTERM and SIGINT, so each child drains, and waits for them all.
    children = []
    for _ in range(args.processes):
        pid = os.fork()
        if pid == 0:
            try:
                serve(args, make())
            finally:
                os._exit(0)
        children.append(pid)

    def forward(signum: int, _frame: object) -> None:
        for child in children:
            os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    for child in children:
        _, code = os.waitpid(child, 0)
        status = status or os.waitstatus_to_exitcode(code)
    return status

"""Running the proxy: its listener in one process or in several on one port, and what a
signal does to it."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Callable

from pd_policy_vllm.http.aio import access_logger, web
from pd_policy_vllm.http.client_gate import GatedRunner
from pd_policy_vllm.http.proxy import Proxy

__all__ = ["DRAIN_SECONDS", "processes", "serve"]

#: How long in-flight requests may take to finish once SIGTERM arrives.
DRAIN_SECONDS = 120.0


async def _serve(args: argparse.Namespace, proxy: Proxy) -> None:
    # web.run_app's own runner, made where nothing reaches its sites' protocol factory,
    # cannot have the client gate in front of each connection: this is run_app's run,
    # with a GatedRunner. The signals end the wait, not the loop, so that the runner's
    # cleanup drains the requests in flight before anything is cancelled.
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = GatedRunner(
        proxy.app(),
        proxy.front_door,
        handler_cancellation=True,
        access_log=access_logger if args.access_log else None,
        shutdown_timeout=DRAIN_SECONDS,
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, args.host, args.port, reuse_port=args.processes > 1).start()
        await stop.wait()
    finally:
        await runner.cleanup()


def serve(args: argparse.Namespace, proxy: Proxy) -> None:
    """Serve ``proxy`` on ``args.host`` and ``args.port`` until SIGTERM or SIGINT, then
    drain: the requests in flight finish, up to ``DRAIN_SECONDS``."""
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

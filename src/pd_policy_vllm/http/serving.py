"""Running the proxy: its listener in one process or in several on one port, and what a
signal does to it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Final

from pd_policy import InvalidConfiguration
from pd_policy_vllm.http.aio import access_logger, web
from pd_policy_vllm.http.client_gate import GatedRunner
from pd_policy_vllm.http.collector import settle
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.reload import reload, summary
from pd_policy_vllm.http.siblings import Siblings
from pd_policy_vllm.http.watch import watched, watching

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
    reloads = _Reloads(proxy, args)
    loop.add_signal_handler(signal.SIGHUP, reloads.start, "SIGHUP")
    runner = GatedRunner(
        proxy.app(),
        proxy.front_door,
        handler_cancellation=True,
        access_log=access_logger if args.access_log else None,
        shutdown_timeout=args.drain_seconds,
    )
    proxy.gate = runner.gate  # a reload's limits reach its connections
    directory = getattr(args, "metrics_dir", None)
    proxy.siblings = Siblings(directory, args.slot) if directory is not None else None
    proxy.metrics.process_restarts.inc(getattr(args, "restarts", 0))
    # Its own metrics stay open to its siblings' scrapes until it has drained.
    own = proxy.siblings.serving(proxy.own_metrics) if proxy.siblings else contextlib.nullcontext()
    await runner.setup()
    settle()  # start-up done: what it made is out of the collector's sight
    cleaned = False
    try:
        async with own, _metrics_port(args, proxy):
            site = web.TCPSite(runner, args.host, args.port, reuse_port=args.processes > 1)
            await site.start()
            for address in runner.addresses:  # port 0 is the kernel's choice: say which
                _log.info("listening on %s port %d", address[0], address[1])
            await _until_stopped(args, proxy, reloads, stopping)
            for task in reloads.tasks:
                task.cancel()
            cleaned = True
            await runner.cleanup()
    finally:
        for task in reloads.tasks:
            task.cancel()
        if not cleaned:
            await runner.cleanup()


@contextlib.asynccontextmanager
async def _metrics_port(args: argparse.Namespace, proxy: Proxy) -> AsyncIterator[None]:
    # --metrics-port: /metrics alone, with no key, for a scraper inside the cluster; the
    # API's port keeps its keys. Every process binds it (SO_REUSEPORT) and answers for all.
    port = getattr(args, "metrics_port", None)
    if port is None:
        yield
        return
    app = web.Application()
    app.router.add_get("/metrics", proxy.scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, args.host, port, reuse_port=args.processes > 1)
        await site.start()
        for address in runner.addresses:
            _log.info("metrics on %s port %d", address[0], address[1])
        yield
    finally:
        await runner.cleanup()


async def _until_stopped(
    args: argparse.Namespace, proxy: Proxy, reloads: _Reloads, stopping: asyncio.Queue[int]
) -> None:
    # Serving: reloads as asked, until SIGTERM (and its pre-stop) or SIGINT.
    if getattr(args, "restarted", False):  # its siblings may have reloaded meanwhile
        reloads.start("restarted")
    if args.config_watch_seconds > 0 and watched(args):
        watch = watching(lambda: reloads.args, lambda: reloads.run("changed"),
                         args.config_watch_seconds)  # fmt: skip
        reloads.tasks.add(asyncio.get_running_loop().create_task(watch))
    received = await stopping.get()
    proxy.lifecycle.draining = True
    if received == signal.SIGTERM and args.pre_stop_seconds > 0:
        _log.info("SIGTERM: not ready; serving %gs more, then draining for %gs",
                  args.pre_stop_seconds, args.drain_seconds)  # fmt: skip
        with contextlib.suppress(TimeoutError):  # a second signal cuts it short
            await asyncio.wait_for(stopping.get(), args.pre_stop_seconds)


class _Reloads:
    """The reloads (SIGHUP's, the watched file's, a restarted process's), one at a time,
    each over the settings the last one left."""

    def __init__(self, proxy: Proxy, args: argparse.Namespace) -> None:
        self.proxy, self.args = proxy, args
        self.lock = asyncio.Lock()
        self.tasks: set[asyncio.Task[None]] = set()

    def start(self, cause: str) -> None:
        task = asyncio.get_running_loop().create_task(self.run(cause))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def run(self, cause: str) -> None:
        """Read the configuration again; ``cause`` (what asked) heads its log line."""
        async with self.lock:
            probe = self.proxy.probe
            stated = probe.stated if probe is not None else None
            argv = getattr(self.args, "argv", None)
            if argv is None:  # not started from a command line: nothing to read again
                _log.error("%s: this proxy was not started from a command line", cause)
                return
            try:
                self.args, done = await reload(self.proxy, self.args, argv, stated=stated)
            except InvalidConfiguration as exc:
                _log.error("%s: the configuration is refused, the running one kept: %s",
                           cause, exc)  # fmt: skip
                return
            _log.info("%s: reloaded %s", cause, json.dumps(summary(done), sort_keys=True))


def serve(args: argparse.Namespace, proxy: Proxy) -> None:
    """Serve ``proxy`` on ``args.host`` and ``args.port`` until SIGTERM or SIGINT, then
    drain ([`lifecycle`][pd_policy_vllm.http.lifecycle]): after SIGTERM, ``/ready`` 503 at
    once and new requests served for ``args.pre_stop_seconds``; then the listener closes
    and the requests in flight finish, up to ``args.drain_seconds``."""
    asyncio.run(_serve(args, proxy))


#: A child that dies this soon after it started, this many times in a row, is not
#: restarted again: the proxy exits with its status.
_QUICK_DEATH: Final = 5.0
_QUICK_DEATHS: Final = 5


def _bound_port(host: str, port: int) -> tuple[socket.socket, int]:
    # Port 0 is the kernel's choice, once: a placeholder bound with SO_REUSEPORT holds
    # the port every child then binds, so that N processes share one port.
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    holder = socket.socket(family, socket.SOCK_STREAM)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind((host, port))
    return holder, int(holder.getsockname()[1])


def processes(args: argparse.Namespace, make: Callable[[], Proxy]) -> int:
    """Serve ``args.processes`` proxies, each made by ``make`` in a process of its own, on
    one port (SO_REUSEPORT: the kernel spreads the connections). A child that dies is
    restarted, and logged, and reads the configuration again (its siblings may have
    reloaded since); one that keeps dying at start ends the proxy with its status.
    SIGTERM and SIGINT go to every child, which drains; the exit status is the first
    failed child's, else 0."""
    holder, port = _bound_port(args.host, args.port)
    holders, shared = [holder], {"port": port}
    if getattr(args, "metrics_port", None) is not None:
        metrics_holder, shared["metrics_port"] = _bound_port(args.host, args.metrics_port)
        holders.append(metrics_holder)
    # Where each child serves its own metrics to the one that takes a scrape: a directory
    # only this user may enter.
    sockets = Path(tempfile.mkdtemp(prefix="pd-policy-processes-"))
    args = argparse.Namespace(**{**vars(args), **shared, "metrics_dir": sockets})
    children: dict[int, tuple[float, int]] = {}  # pid: when it started, its slot
    restarts = [0] * args.processes  # by slot
    stopping = False

    def start(slot: int, restarted: bool = False) -> None:
        pid = os.fork()
        if pid == 0:
            for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(signum, signal.SIG_DFL)
            for held in holders:
                held.close()
            code = 0
            try:
                # A restarted child is made from the configuration read at start: it reads
                # the one its siblings run now (a reload or a changed file since).
                more = {"restarted": restarted, "restarts": restarts[slot], "slot": slot}
                serve(argparse.Namespace(**{**vars(args), **more}), make())
            except BaseException:
                _log.exception("proxy process failed")
                code = 1
            finally:
                os._exit(code)
        children[pid] = (time.monotonic(), slot)

    def forward(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    for slot in range(args.processes):
        start(slot)

    def reload_all(signum: int, _frame: object) -> None:
        for child in list(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, reload_all)  # each process reloads itself
    status, quick = 0, 0
    while children:
        pid, code = os.wait()
        child = children.pop(pid, None)
        if child is None:
            continue
        started, slot = child
        exit_code = os.waitstatus_to_exitcode(code)
        (sockets / f"{slot}.sock").unlink(missing_ok=True)  # killed, it could not
        if stopping:
            status = status or exit_code
            continue
        quick = quick + 1 if time.monotonic() - started < _QUICK_DEATH else 0
        _log.warning("proxy process %d exited (%d); restarting it", pid, exit_code)
        if quick >= _QUICK_DEATHS:
            _log.error("proxy processes keep dying at start: stopping")
            forward(signal.SIGTERM, None)
            status = exit_code or 1
            continue
        restarts[slot] += 1  # counted in /metrics by the child in its slot
        start(slot, restarted=True)
    for held in holders:
        held.close()
    shutil.rmtree(sockets, ignore_errors=True)
    return status

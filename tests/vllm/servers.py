"""Real server processes for interop tests: started on 127.0.0.1, stopped by process id.

A server (SMG's servicer, ``vllm serve``, the proxy) runs in a process group of
its own, so stopping it by its process id also stops the engine-core process
it spawned. Servers start together, which on two cores takes about as long as
the slowest one alone, and stop together.

A server process is given its ports on its command line (``vllm serve --port``, the
KV-event endpoints of its config), so they are chosen before it binds them, outside the
range the kernel hands out for port 0, and a server that finds one taken is started
again on others: no start fails on a port another process took first.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from described import Description

__all__ = [
    "ENGINE_ARGS", "REBINDS", "Server", "candidate_ports", "running", "start_all", "stop_all",
]  # fmt: skip

#: How long a server may take to become ready (vLLM takes 25-70 s on two cores).
START_TIMEOUT = 240.0
#: How long a server may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT = 30.0
#: How many times a server whose port was taken is started again, on other ports.
REBINDS: Final = 3
#: What a server that could not bind a port of its writes: Python's and ZeroMQ's
#: ``Address already in use`` (vLLM's HTTP and KV-event sockets, the proxy's, Ray's),
#: gRPC's ``Failed to bind`` (SMG's servicer).
PORT_TAKEN: Final = re.compile(r"(?i)address already in use|failed to bind")

#: The environment every server gets: offline, small KV cache, no usage reports.
BASE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # The launchers' AsyncLLM spawns its engine core either way; with this off, the CPU
    # platform lets that core run the model itself (ENGINE_ARGS) instead of spawning a
    # worker process too: one interpreter importing torch and vLLM fewer per server,
    # which took two servers starting together from 102 s to 40 s on two cores.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}

#: Every engine server's flags: its model in the engine core's process (see BASE_ENV).
ENGINE_ARGS: tuple[str, ...] = ("--distributed-executor-backend", "uni")


def _outside_ephemeral() -> range:
    # The kernel gives every bind to port 0 and every outgoing connection a port of its
    # ephemeral range: a port outside it is taken only by a process that names it.
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return max(range(10000, low), range(high + 1, 65536), key=len)


def _bound(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return True
    return False


def candidate_ports(count: int) -> tuple[int, ...]:
    """``count`` distinct ports for a server process to bind, which it must be given (a
    process's own bind to port 0 could not be read back): each outside the kernel's
    ephemeral range and unbound when chosen. Another process may still take one before
    the server binds it; the server's start sees that, and starts again on others
    ([`Server`][servers.Server])."""
    pool, chosen = _outside_ephemeral(), list[int]()
    pick = random.SystemRandom()
    while len(chosen) < count:
        port = pick.choice(pool)
        if port not in chosen and not _bound(port):
            chosen.append(port)
    return tuple(chosen)


@attrs.define
class Server:
    """One server process: its command line on its ports, where it logs, and how to tell
    it is ready.

    ``command`` is its command line after the interpreter, made for ``ports`` (the first
    is the one it serves on: ``url``, ``address``) at each start; ``ready`` says whether
    the started server serves. A server that exits having written that a port was taken
    (``PORT_TAKEN``) is started again on ``candidate_ports``, at most ``REBINDS`` times,
    unless its ports are ``fixed`` (a member restarted where its peers know it).
    ``port_env`` gives more of its environment from its ports at each start (a port it
    reads from its environment, as vLLM's NIXL side channel). ``description``: what a
    worker was started with ([`described`][]).
    """

    name: str
    command: Callable[[tuple[int, ...]], Sequence[str]]
    log: Path
    ready: Callable[[Server], bool]
    env: dict[str, str] = attrs.field(factory=dict)
    ports: tuple[int, ...] = ()
    fixed: bool = False
    port_env: Callable[[tuple[int, ...]], dict[str, str]] | None = None
    #: What a ``vllm serve`` worker was started with, for the proxy's configuration file
    #: (``None``: not described, as a worker in development mode describes itself).
    description: Description | None = None
    process: subprocess.Popen[bytes] | None = None
    #: How many times it was started again on other ports.
    rebound: int = 0
    _log_from: int = 0

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, **BASE_ENV, **self.env}
        env.update(self.port_env(self.ports) if self.port_env is not None else {})
        # A start again on other ports goes on with the same log, after the last one's.
        self._log_from = self.log.stat().st_size if self.rebound and self.log.exists() else 0
        with self.log.open("ab" if self._log_from else "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, *self.command(self.ports)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group: stopped with its children
            )

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def port_taken(self) -> bool:
        """Whether this start exited because a port of its was taken."""
        if self.process is None or self.process.poll() is None or not self.log.exists():
            return False
        with self.log.open("rb") as log:
            log.seek(self._log_from)
            said = log.read().decode(errors="replace")
        return PORT_TAKEN.search(said) is not None

    def _start_elsewhere(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)  # what it spawned before it failed
        self.rebound += 1
        taken = self.ports
        self.ports = candidate_ports(len(taken))
        with self.log.open("ab") as log:
            log.write(f"--- a port of {taken} was taken: started on {self.ports}\n".encode())
        self.start()

    def wait_ready(self, deadline: float) -> None:
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if self.port_taken() and not self.fixed and self.rebound < REBINDS:
                    self._start_elsewhere()
                    continue
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
                )
            with contextlib.suppress(Exception):
                if self.ready(self):
                    return
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} was not ready in {START_TIMEOUT:.0f} s:\n{self.tail()}")

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def start_all(servers: Sequence[Server]) -> None:
    """Start every server, then wait until each is ready; on failure, stop them all."""
    try:
        for server in servers:
            server.start()
        deadline = time.monotonic() + START_TIMEOUT
        for server in servers:
            server.wait_ready(deadline)
    except BaseException:
        stop_all(servers)
        raise


def stop_all(servers: Sequence[Server]) -> None:
    """SIGTERM every server's process group, then SIGKILL whatever is left after a while."""
    for server in servers:
        server.signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    for server in servers:
        if server.process is None:
            continue
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
    for server in servers:
        # The launcher may be gone while its engine core lingers: kill the whole group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server.pid, signal.SIGKILL)
        if server.process is not None:
            server.process.wait()


@contextlib.contextmanager
def running(servers: Sequence[Server]) -> Iterator[Sequence[Server]]:
    """Start ``servers`` for the duration of the block; stop them all by process id after."""
    start_all(servers)
    try:
        yield servers
    finally:
        stop_all(servers)

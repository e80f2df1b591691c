"""Real server processes for interop tests: started on 127.0.0.1, stopped by process id.

A server (SMG's servicer, ``vllm serve``, the proxy) runs in a process group of
its own, so stopping it by its process id also stops the engine-core process
it spawned. Servers start together, which on two cores takes about as long as
the slowest one alone, and stop together.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs

__all__ = ["ENGINE_ARGS", "Server", "free_port", "running", "start_all", "stop_all"]

#: How long a server may take to become ready (vLLM takes 25-70 s on two cores).
START_TIMEOUT = 240.0
#: How long a server may take to stop after SIGTERM before it is killed.
STOP_TIMEOUT = 30.0

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


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@attrs.define
class Server:
    """One server process: its command line, where it logs, and how to tell it is ready."""

    name: str
    argv: Sequence[str]
    log: Path
    ready: Callable[[], bool]
    env: dict[str, str] = attrs.field(factory=dict)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, **BASE_ENV, **self.env}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, *self.argv],
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

    def wait_ready(self, deadline: float) -> None:
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with {self.process.returncode}:\n{self.tail()}"
                )
            with contextlib.suppress(Exception):
                if self.ready():
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

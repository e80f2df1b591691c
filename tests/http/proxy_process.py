"""A ``pd-policy-proxy`` started as a process of its own, for the tests that send it
signals: its URL read from its log (it binds port 0 and says which port it got), its
log lines as they come, stopped by process group when the block ends."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence

import attrs

__all__ = ["Running", "proxy_command", "started"]

_LISTENING = re.compile(r"listening on \S+ port (\d+)")


@attrs.frozen
class Running:
    """The proxy's URL, its process, and its log lines so far (a list that grows)."""

    url: str
    process: subprocess.Popen[bytes]
    log: list[str]


def proxy_command(*flags: str) -> list[str]:
    """``pd-policy-proxy`` in this interpreter, on port 0 of 127.0.0.1, with ``flags``."""
    return [sys.executable, "-m", "pd_policy_vllm.http.cli", "--port", "0", *flags]


@contextlib.asynccontextmanager
async def started(argv: Sequence[str], *, timeout: float = 60) -> AsyncIterator[Running]:
    """Start ``argv`` (a proxy, or something that runs one) in its own process group and
    wait until it logs where it listens. On leaving: SIGTERM, and SIGKILL after 30 s."""
    process = subprocess.Popen(list(argv), stderr=subprocess.PIPE, start_new_session=True)
    log: list[str] = []
    assert process.stderr is not None
    stderr = process.stderr

    def read() -> None:
        for raw in stderr:
            log.append(raw.decode(errors="replace"))

    reader = asyncio.create_task(asyncio.to_thread(read))
    try:
        deadline = time.monotonic() + timeout
        port = None
        while port is None:
            assert process.poll() is None, f"it exited ({process.returncode}): {log}"
            assert time.monotonic() < deadline, f"it never said where it listens: {log}"
            found = next((m for m in map(_LISTENING.search, log) if m), None)
            port = int(found.group(1)) if found else None
            await asyncio.sleep(0.05)
        yield Running(f"http://127.0.0.1:{port}", process, log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.to_thread(process.wait, 30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        await reader

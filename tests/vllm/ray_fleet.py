"""The Ray Serve LLM deployment the Ray tests share: ``ray_stand.py`` as a server process.

One driver process starts its own Ray cluster on 127.0.0.1 and deploys the applications
(see ``ray_stand.py``); it is stopped by its process group, after which its cluster is
gone too (the driver shuts it down on SIGTERM; SIGKILL of the group after a while).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
from servers import Server, free_port, stop_all

__all__ = ["RayFleet", "ray_fleet"]

#: The tag Serve puts on a policy decode replica's log lines: its replica id.
_REPLICA = re.compile(r"policy_Decode:llava (\w+) ")

HERE = Path(__file__).resolve().parent
#: Two cores deploy five engines of the tiny LLaVA in about three minutes.
DEPLOY_TIMEOUT = 900.0


@attrs.frozen
class RayFleet:
    """The running deployment: its HTTP address and where Serve writes its replicas' logs."""

    url: str
    serve_logs: str

    def _lines(self, marker: str) -> Iterator[tuple[str, str]]:
        # The server's lines reach its worker's stderr file, tagged with its replica id.
        for log in (Path(self.serve_logs).parent).glob("worker-*.err"):
            for line in log.read_text(errors="replace").splitlines():
                found = _REPLICA.search(line)
                if found and marker in line:
                    yield found.group(1), line

    def decode_calls(self) -> Counter[str]:
        """Requests each decode replica of the policy application served so far, by replica
        id (the server logs one line a request)."""
        return Counter(replica for replica, _ in self._lines('"outcome":"ok"'))

    def capability_lines(self) -> dict[str, str]:
        """What each policy decode replica said it read of its engine at start, by id."""
        return dict(self._lines("decode replica: "))


@contextlib.contextmanager
def ray_fleet(root: Path, model: Path, *, decode_replicas: int = 2) -> Iterator[RayFleet]:
    """The deployment of ``model`` (``ray_stand.py``), started for the block."""
    port = free_port()
    ready = root / "ready.json"
    spec: dict[str, Any] = {
        "model": str(model), "model_id": "llava", "transfers": str(root / "transfers"),
        "port": port, "decode_replicas": decode_replicas, "own": True, "ready": str(ready),
    }  # fmt: skip
    (root / "transfers").mkdir()
    config = root / "stand.json"
    config.write_text(json.dumps(spec))
    server = Server("ray", [str(HERE / "ray_stand.py"), str(config)], root / "ray.log",
                    ready=ready.exists)  # fmt: skip
    server.start()
    try:
        server.wait_ready(time.monotonic() + DEPLOY_TIMEOUT)
        yield RayFleet(f"http://127.0.0.1:{port}", json.loads(ready.read_text())["serve_logs"])
    finally:
        stop_all([server])
        # The engines run in process groups of their own: killed by pid if the driver
        # did not get to them.
        for pid in json.loads(ready.read_text()).get("pids", []) if ready.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

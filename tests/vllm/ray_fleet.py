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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
from nixl_peers import nixl_config, nixl_environment
from servers import Server, candidate_ports, stop_all

__all__ = ["RayFleet", "ray_fleet", "ray_nixl_fleet"]

#: The tag Serve puts on a decode replica's log lines: its application, model and id.
_REPLICA = re.compile(r"(\w+)_Decode:(\w+) (\w+) ")

HERE = Path(__file__).resolve().parent
#: Two cores deploy five engines of the tiny LLaVA and two of the tiny Qwen2-VL in about
#: four minutes.
DEPLOY_TIMEOUT = 900.0


@attrs.frozen
class RayFleet:
    """The running deployment: its HTTP address and where Serve writes its replicas' logs."""

    url: str
    serve_logs: str
    #: Where the cluster serves its Prometheus metrics, if it was asked to.
    metrics: str = ""

    def _lines(self, marker: str, app: str) -> Iterator[tuple[str, str]]:
        # The server's lines reach its worker's stderr file, tagged with its replica id.
        for log in (Path(self.serve_logs).parent).glob("worker-*.err"):
            for line in log.read_text(errors="replace").splitlines():
                found = _REPLICA.search(line)
                if found and found.group(1) == app and marker in line:
                    yield found.group(3), line

    def decode_calls(self, app: str = "policy") -> Counter[str]:
        """Requests each decode replica of application ``app`` served so far, by replica
        id (the server logs one line a request)."""
        return Counter(replica for replica, _ in self._lines('"outcome":"ok"', app))

    def request_lines(self, app: str) -> list[str]:
        """The request lines of ``app``'s decode replicas so far (one a request)."""
        return [line for _, line in self._lines('"request_id":', app)]

    def capability_lines(self, app: str = "policy") -> dict[str, str]:
        """What each decode replica of ``app`` said it read of its engine at start, by id."""
        return dict(self._lines("decode replica: ", app))


@contextlib.contextmanager
def ray_fleet(
    root: Path, model: Path, mrope_model: Path, *, decode_replicas: int = 2
) -> Iterator[RayFleet]:
    """The deployment of ``model`` (the LLaVA applications) and ``mrope_model`` (the
    Qwen2-VL one) of ``ray_stand.py``, started for the block."""
    spec: dict[str, Any] = {
        "model": str(model), "model_id": "llava", "transfers": str(root / "transfers"),
        "mrope_model": str(mrope_model), "mrope_model_id": "qwen2vl",
        "mrope_transfers": str(root / "mrope-transfers"),
        "decode_replicas": decode_replicas, "own": True,
    }  # fmt: skip
    (root / "transfers").mkdir()
    (root / "mrope-transfers").mkdir()
    with _stand(root, spec, lambda ports: {}) as fleet:
        yield fleet


@contextlib.contextmanager
def ray_nixl_fleet(root: Path, model: Path) -> Iterator[RayFleet]:
    """The policy's application of ``model`` (the tiny LLaVA) alone, on vLLM's
    ``NixlConnector``: a full-vision prefill and one language-model-only decode replica,
    each with a NIXL side channel of its own on 127.0.0.1 and the tests' progress-thread
    switch ([`nixl_environment`][nixl_peers.nixl_environment]), the cluster's Prometheus
    metrics on a loopback port (``RayFleet.metrics``). Started for the block."""
    spec: dict[str, Any] = {"model": str(model), "model_id": "llava", "decode_replicas": 1}
    roles = ("kv_producer", "kv_consumer")

    def nixl(ports: tuple[int, ...]) -> dict[str, Any]:
        # The HTTP port, the metrics port, then each role's side channel.
        side = dict(zip(roles, ports[2:4], strict=True))
        return {
            "metrics_port": ports[1],
            "nixl": {
                "configs": {role: nixl_config(role) for role in roles},
                "env": {role: {**nixl_environment(),
                               "VLLM_NIXL_SIDE_CHANNEL_PORT": str(side[role])}
                        for role in roles},
            },
        }  # fmt: skip

    with _stand(root, spec, nixl, ports=4) as fleet:
        yield fleet


@contextlib.contextmanager
def _stand(
    root: Path,
    spec: dict[str, Any],
    more: Callable[[tuple[int, ...]], dict[str, Any]],
    *,
    ports: int = 1,
) -> Iterator[RayFleet]:
    """``ray_stand.py`` on ``spec``, and what ``more`` adds for its ``ports`` (the first:
    its HTTP port), started for the block."""
    ready = root / "ready.json"
    config = root / "stand.json"

    def command(chosen: tuple[int, ...]) -> list[str]:
        # The ports are in the config: written anew for each start.
        config.write_text(
            json.dumps({**spec, **more(chosen), "port": chosen[0], "ready": str(ready)})
        )
        return [str(HERE / "ray_stand.py"), str(config)]

    server = Server("ray", command, root / "ray.log", ready=lambda _: ready.exists(),
                    ports=candidate_ports(ports))  # fmt: skip
    server.start()
    try:
        server.wait_ready(time.monotonic() + DEPLOY_TIMEOUT)
        metrics = f"http://127.0.0.1:{server.ports[1]}" if ports > 1 else ""
        yield RayFleet(server.url, json.loads(ready.read_text())["serve_logs"], metrics)
    finally:
        stop_all([server])
        # The engines run in process groups of their own: killed by pid if the driver
        # did not get to them.
        for pid in json.loads(ready.read_text()).get("pids", []) if ready.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

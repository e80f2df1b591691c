"""A fleet of real ``vllm serve`` workers whose members a test kills and restarts: two
full-vision prefills (KV producers) and two ``--language-model-only`` decodes (KV
consumers) of one model, over one transfer directory, each with an API key.

A member restarts on its own port, as another kind if the test says so (a decode
restarted with its vision encoder, say); the proxy in front must notice. Every process
is stopped by process id when the block ends.

With ``kv_events``, the prefills also publish their KV events and serve the render route
as ``kv_fleet`` starts them (the proxy can then route by what each one caches), and every
worker reports its cached prompt tokens. With ``dev_mode`` every member describes itself
(``/server_info``), so that a member restarted as another kind is read as what it is now;
else the proxy's configuration file describes each as it was first started.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import attrs
from described import described_argv
from http_peers import serves
from nixl_peers import kv_worker
from servers import START_TIMEOUT, Server, candidate_ports, running, stop_all
from tiny_models import TinyModel

__all__ = ["ADMIN_KEY", "CLIENT_KEY", "WORKER_KEY", "Pool", "fleet_proxy", "pool_fleet"]

#: The key every worker of the pool takes (``vllm serve --api-key``): a test secret.
WORKER_KEY: Final = "pool-worker-key"
#: The key the proxy in front of the pool takes from its clients.
CLIENT_KEY: Final = "pool-client-key"
#: The key the proxy's admin routes take: not a client's.
ADMIN_KEY: Final = "pool-admin-key"


@attrs.define
class Pool:
    """The pool's servers by name (``p1``, ``p2``, ``d1``, ``d2``); its prefills publish
    their KV events when ``kv_events``."""

    model: TinyModel
    root: Path
    servers: dict[str, Server]
    kv_events: bool = False
    #: The KV goes over vLLM's ``NixlConnector`` (the demo), not the ``TransferConnector``.
    nixl: bool = False
    #: Every member runs vLLM's development mode: it describes itself.
    dev_mode: bool = False

    @property
    def urls(self) -> dict[str, str]:
        """Each server's URL, by name (once started: its ports are its own to choose)."""
        return {name: server.url for name, server in self.servers.items()}

    @property
    def baseline(self) -> str:
        """A full-vision server to match: the first prefill, sent plain requests."""
        return self.urls["p1"]

    def _server(
        self, name: str, *, language_model_only: bool, ports: tuple[int, ...] | None = None
    ) -> Server:
        prefill = name.startswith("p")
        role = "kv_producer" if prefill else "kv_consumer"
        extra: tuple[str, ...] = ("--api-key", WORKER_KEY)
        if self.kv_events:
            extra += ("--enable-prompt-tokens-details",)
        events = self.kv_events and prefill
        if events:
            extra += ("--enable-scale-out", "--enable-prefix-caching")
        return kv_worker(
            name, self.model, self.root, role, nixl=self.nixl, transfers=self.root / "transfers",
            language_model_only=language_model_only, extra=extra, events=events, ports=ports,
            dev_mode=self.dev_mode,
        )  # fmt: skip

    def kill(self, name: str) -> None:
        """Kill ``name``'s process group at once (SIGKILL), as a crash would."""
        server = self.servers[name]
        server.signal(signal.SIGKILL)
        assert server.process is not None
        server.process.wait()

    def start(self, name: str, *, language_model_only: bool) -> None:
        """Start ``name`` again on its ports, as the kind given; wait until it serves."""
        ports = self.servers[name].ports  # where the proxy knows it: taken, it fails
        server = self._server(name, language_model_only=language_model_only, ports=ports)
        server.start()
        server.wait_ready(time.monotonic() + START_TIMEOUT)
        self.servers[name] = server


@contextmanager
def pool_fleet(
    model: TinyModel, root: Path, *, kv_events: bool = False, nixl: bool = False,
    dev_mode: bool = False,
) -> Iterator[Pool]:  # fmt: skip
    """Start the pool of ``model`` (logs and transfers under ``root``); its prefills
    publishing their KV events when ``kv_events``; on vLLM's ``NixlConnector`` when
    ``nixl`` (a member restarted keeps its NIXL side channel's port with its others);
    each member in vLLM's development mode when ``dev_mode``."""
    root.mkdir(parents=True, exist_ok=True)
    pool = Pool(model, root, {}, kv_events, nixl, dev_mode)
    for name in ("p1", "p2", "d1", "d2"):
        pool.servers[name] = pool._server(name, language_model_only=name.startswith("d"))
    try:
        with running(list(pool.servers.values())):
            yield pool
    finally:
        stop_all(list(pool.servers.values()))  # restarted members are new processes


def fleet_proxy(pool: Pool, *flags: str) -> Server:
    """``pd-policy-proxy`` in front of the whole pool, once it runs (its members' URLs are
    theirs then), not yet started (its URL: the server's ``url``, once started): the
    workers' key from the environment, the clients' from a file, probes every second, the
    admin routes, to the admin key of the environment; the members that do not describe
    themselves in its configuration file."""
    keys = pool.root / "client-keys"
    keys.write_text(f"# the proxy's clients\n{CLIENT_KEY}\n")
    workers: list[str] = []
    for name in ("p1", "p2"):
        workers += ["--prefill", pool.urls[name]]
    for name in ("d1", "d2"):
        workers += ["--decode", pool.urls[name]]
    argv = ["-m", "pd_policy_vllm.http.cli", "--no-mrope", "--admin",
            "--probe-interval", "1", "--api-keys-file", str(keys), *flags,
            *described_argv(workers)]  # fmt: skip
    env = {"PD_POLICY_WORKER_API_KEY": WORKER_KEY, "PD_POLICY_ADMIN_API_KEYS": ADMIN_KEY}

    def command(ports: tuple[int, ...]) -> list[str]:
        return [*argv, "--port", str(ports[0])]

    return Server("fleet-proxy", command, pool.root / "fleet-proxy.log", serves, env,
                  ports=candidate_ports(1))  # fmt: skip

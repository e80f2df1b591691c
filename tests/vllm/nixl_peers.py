"""``vllm serve`` workers on vLLM's own ``NixlConnector`` (NIXL over UCX, host memory), and
what proves that NIXL moved a request's KV: the decode's ``/metrics``.

Each worker gets ``VLLM_NIXL_SIDE_CHANNEL_HOST=127.0.0.1`` and a side-channel port of its own
(NIXL's default, 5600, would be every worker's), chosen with its HTTP port and chosen again
with it. Its ``PYTHONPATH`` starts with ``nixl_site/``, whose ``sitecustomize`` is the
test-environment switch for NIXL's progress thread: off in these tests (an idle worker's
thread busy-polls a core, and there are two), unless the run's environment sets
``PD_POLICY_TEST_NIXL_PROGRESS_THREAD`` itself (``on``: NIXL as shipped).
"""

from __future__ import annotations

import contextlib
import os
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import attrs
from http_peers import proxy, vllm_server
from live_engines import BLOCK_SIZE, connector
from servers import Server, candidate_ports, running
from tiny_models import TinyModel

__all__ = [
    "LLAVA_BLOCK_BYTES", "PROGRESS_THREAD", "SWITCH_MARK", "NixlCounters", "NixlPair",
    "NixlPairs", "Transfer", "kv_worker", "nixl_config", "nixl_counters", "nixl_environment",
    "nixl_note", "nixl_server", "nixl_worker", "progress_thread_off",
]  # fmt: skip

#: Where the switch's ``sitecustomize`` is.
NIXL_SITE: Final = Path(__file__).parent / "nixl_site"
#: The switch (see ``nixl_site/sitecustomize.py``).
PROGRESS_THREAD: Final = "PD_POLICY_TEST_NIXL_PROGRESS_THREAD"
#: The bytes of one KV block of the tiny LLaVA, as NIXL moves it: 2 layers, keys and values,
#: one KV head of 64 float32 values per token.
LLAVA_BLOCK_BYTES: Final = 2 * 2 * BLOCK_SIZE * 64 * 4
#: What the switch writes to a server's log when it takes effect.
SWITCH_MARK: Final = "pd-policy test switch: NIXL agents without their progress thread"


def nixl_config(role: str, connector: str = "NixlConnector", **more: Any) -> dict[str, Any]:
    """A worker's ``--kv-transfer-config`` on ``connector`` in ``role``, its KV in host memory,
    with ``more`` of it (``kv_load_failure_policy``, ``kv_connector_extra_config``)."""
    return {"kv_connector": connector, "kv_role": role, "kv_buffer_device": "cpu", **more}


def progress_thread_off() -> bool:
    """Whether the servers started here run NIXL without its progress thread."""
    return os.environ.get(PROGRESS_THREAD, "off") == "off"


def nixl_note(workers: str) -> str:
    """What a demo prints of the NIXL its ``workers`` run."""
    if progress_thread_off():
        how = (f"NIXL's progress thread off ({PROGRESS_THREAD}=on runs NIXL as shipped: each "
               "agent's thread busy-polls a core, slow on two)")  # fmt: skip
    else:
        how = "NIXL as shipped, its progress thread on"
    return f"starting {workers} on vLLM's NixlConnector (UCX, KV in host memory), {how}..."


def nixl_server(
    name: str,
    model: TinyModel,
    logs: Path,
    role: str,
    *,
    connector: str = "NixlConnector",
    language_model_only: bool = False,
    limits: dict[str, int] | None = None,
    extra: tuple[str, ...] = (),
    kv: dict[str, Any] | None = None,
    dev_mode: bool = False,
) -> Server:
    """``vllm serve`` of ``model`` on ``connector`` in ``role``, not yet started; ``kv``: more
    of its ``--kv-transfer-config``; ``dev_mode``: it describes itself
    ([`vllm_server`][http_peers.vllm_server])."""
    server = vllm_server(
        name, model, logs, language_model_only=language_model_only,
        kv_config=nixl_config(role, connector, **(kv or {})), limits=limits, extra=extra,
        dev_mode=dev_mode,
    )  # fmt: skip
    return nixl_worker(server)


def kv_worker(
    name: str, model: TinyModel, logs: Path, role: str, *, nixl: bool, transfers: Path,
    **options: Any,
) -> Server:  # fmt: skip
    """``vllm serve`` of ``model`` in KV ``role``, not yet started: on vLLM's ``NixlConnector``
    when ``nixl`` (what the demos run), else on the ``TransferConnector`` over ``transfers``
    (what the fleets' tests run: they read the decode's own report of each load). ``options``
    are [`vllm_server`][http_peers.vllm_server]'s."""
    config = nixl_config(role) if nixl else connector(role, transfers)
    server = vllm_server(name, model, logs, kv_config=config, **options)
    return nixl_worker(server) if nixl else server


def nixl_environment() -> dict[str, str]:
    """What a NIXL worker's environment gets beyond its side channel's port: the side
    channel on 127.0.0.1, and the progress-thread switch (its ``sitecustomize`` first on
    the ``PYTHONPATH``, and its value). The rest of the ``PYTHONPATH`` is this process's,
    made absolute: a worker may start in another directory (Ray's replicas do)."""
    path = os.environ.get("PYTHONPATH", "")
    rest = [os.path.abspath(entry) for entry in path.split(os.pathsep) if entry]
    return {
        "VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join([str(NIXL_SITE), *rest]),
        PROGRESS_THREAD: "off" if progress_thread_off() else "on",
    }


def nixl_worker(server: Server) -> Server:
    """``server`` (not yet started, its command on its ports) made a NIXL worker: a side
    channel of its own, on a port after its others (chosen again with them on a rebind,
    kept with them when they are ``fixed``, as for a worker restarted where its peers know
    it), and [`nixl_environment`][nixl_peers.nixl_environment]. Returned."""
    if not server.fixed:  # one more port: its NIXL side channel's
        server.ports = candidate_ports(len(server.ports) + 1)
    side = len(server.ports) - 1
    server.port_env = lambda ports: {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(ports[side])}
    server.env.update(nixl_environment())
    return server


@attrs.frozen
class NixlCounters:
    """A worker's NIXL counters (its ``/metrics``): transfers it completed, the bytes they
    moved, the transfers that failed, and (a prefill's) the requests whose KV it released
    when their lease ran out. Subtracting two readings gives what happened in between."""

    transfers: float
    bytes: float
    failed: float
    expired: float = 0.0

    def __sub__(self, earlier: NixlCounters) -> NixlCounters:
        return NixlCounters(
            self.transfers - earlier.transfers,
            self.bytes - earlier.bytes,
            self.failed - earlier.failed,
            self.expired - earlier.expired,
        )


_COUNTERS: Final = {
    "vllm:nixl_xfer_time_seconds_count": "transfers",
    "vllm:nixl_bytes_transferred_sum": "bytes",
    "vllm:nixl_num_failed_transfers_total": "failed",
    "vllm:nixl_num_kv_expired_reqs_total": "expired",
}


#: How Ray's metrics agent exports vLLM's metrics: ``vllm:`` becomes ``ray_vllm_``.
_RAY_PREFIX: Final = "ray_vllm_"


def nixl_counters(url: str, labels: Mapping[str, str] | None = None) -> NixlCounters:
    """The NIXL counters at ``url`` (a vLLM server, or a Ray cluster's metrics port, which
    exports them as ``ray_vllm_...``), summed over the series that carry every one of
    ``labels`` (all of them by default; 0 for a counter not published yet)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = [f'{key}="{value}"' for key, value in (labels or {}).items()]
    values = dict.fromkeys(_COUNTERS.values(), 0.0)
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        name = name.partition(" ")[0]
        if name.startswith(_RAY_PREFIX):
            name = "vllm:" + name.removeprefix(_RAY_PREFIX)
        if name in _COUNTERS and all(label in rest.rpartition("}")[0] for label in wanted):
            values[_COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
    return NixlCounters(**values)


@attrs.frozen
class NixlPair:
    """A running P/D pair on one NIXL connector, and the proxy in front of it: a full-media
    prefill (KV producer), which also answers as a full server when sent a plain request,
    and a ``--language-model-only`` decode (KV consumer)."""

    connector: str
    prefill: str
    decode: str
    proxy: str
    #: The prefill's and the decode's server (their logs).
    servers: tuple[Server, Server]

    @property
    def baseline(self) -> str:
        """A full server to match: the prefill, sent plain requests."""
        return self.prefill

    @property
    def mover(self) -> str:
        """The worker that posts the NIXL transfers, and counts them in its ``/metrics``:
        the decode reads the blocks on pull, the prefill writes them on push."""
        return self.prefill if self.connector == "NixlPushConnector" else self.decode


class NixlPairs:
    """One NIXL pair of ``model`` at a time (``get``): asking for another connector's pair
    stops the running one first, so that a module that runs pull and push holds two vLLM
    servers at once, never four. ``proxy_flags`` are the proxy's flags beyond its workers:
    never ``--kv-mode``, which the proxy reads from the workers' descriptions (their
    ``/server_info`` when ``dev_mode``, else its configuration file)."""

    def __init__(
        self, model: TinyModel, root: Path, *, limits: dict[str, int],
        extra: tuple[str, ...] = (), proxy_flags: tuple[str, ...] = (), dev_mode: bool = False,
    ) -> None:  # fmt: skip
        self._model, self._root, self._limits = model, root, limits
        self._extra, self._proxy_flags, self._dev_mode = extra, proxy_flags, dev_mode
        self._stack = contextlib.ExitStack()
        self._pair: NixlPair | None = None
        #: How many pairs were started, by connector.
        self.starts: dict[str, int] = {}

    def get(self, connector: str) -> NixlPair:
        """The running pair on ``connector``, started (the other one stopped) if need be."""
        if self._pair is not None and self._pair.connector == connector:
            return self._pair
        self.close()
        logs = self._root / connector
        logs.mkdir(parents=True, exist_ok=True)
        common: dict[str, Any] = {"connector": connector, "extra": self._extra,
                                  "dev_mode": self._dev_mode}  # fmt: skip
        p = nixl_server("prefill", self._model, logs, "kv_producer", limits=self._limits,
                        **common)  # fmt: skip
        d = nixl_server("decode", self._model, logs, "kv_consumer", language_model_only=True,
                        **common)  # fmt: skip
        self._stack.enter_context(running([p, d]))
        x = proxy(logs, p.url, [d.url], *self._proxy_flags)
        self._stack.enter_context(running([x]))
        self._pair = NixlPair(connector, p.url, d.url, x.url, (p, d))
        self.starts[connector] = self.starts.get(connector, 0) + 1
        return self._pair

    def close(self) -> None:
        """Stop the running pair and its proxy, if any."""
        try:
            self._stack.close()
        finally:
            self._pair = None


class Transfer:
    """The NIXL transfers of a pair during a ``with`` block, read from the ``/metrics`` of
    the worker that posts them on entry and on exit: at least one completed, none failed,
    more than no bytes moved (asserted on a clean exit). ``bytes``: how many, once the
    block is left. The worker is ``NixlPair.mover``, or the URL of its metrics, with the
    ``labels`` of its series where that URL serves several workers' (a Ray cluster's).
    Ray exports its counts every second: the exit waits for them (see below), so that
    the next block's entry reading holds this block's transfers too.

    A push prefill counts a write when an engine step of its polls it, which may come
    after the decode answered: the exit waits for the count (``WAIT`` seconds at most)."""

    WAIT: Final = 30.0

    def __init__(self, mover: NixlPair | str, labels: Mapping[str, str] | None = None) -> None:
        self._url = mover.mover if isinstance(mover, NixlPair) else mover
        self._labels = labels
        self._before = NixlCounters(0, 0, 0)
        self.bytes = 0.0

    def __enter__(self) -> Transfer:
        self._before = nixl_counters(self._url, self._labels)
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is not None:
            return
        deadline = time.monotonic() + self.WAIT
        delta = nixl_counters(self._url, self._labels) - self._before
        while delta.transfers < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
            delta = nixl_counters(self._url, self._labels) - self._before
        assert delta.transfers >= 1 and delta.bytes > 0, delta
        assert delta.failed == 0, delta
        self.bytes = delta.bytes

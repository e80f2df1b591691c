"""The ``vllm serve`` workers a test started, described to the proxy by a configuration
file (``[[workers]]``, one table a worker) instead of vLLM's development mode.

A worker is described by what the test started it with
([`Description`][described.Description], recorded on its ``Server`` by
[`vllm_server`][http_peers.vllm_server]): ``--language-model-only``, its
``--kv-transfer-config``, its ``--kv-events-config`` and ``--block-size``, and its media
domains (none given: any host, which the file says as an empty list). A proxy's worker
flags (``--prefill URL``, ``--decode URL``, ``--encode URL``) naming a described worker
that runs become one ``[[workers]]`` table each of a file next to its log
([`described_argv`][described.described_argv]); a worker started in development mode is
not described, and the proxy reads its own ``/server_info``.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
from servers import Server

__all__ = [
    "Description", "described_argv", "kv_events_config", "register", "shown", "stand_in", "toml",
    "workers_file",
]  # fmt: skip

#: The proxy's flags that name a worker, and the role each gives it.
ROLE_FLAGS: Final = {"--prefill": "prefill", "--decode": "decode", "--encode": "encode"}

#: Every described server made in this process; a URL names the one running on it (a
#: member restarted, or started again on other ports, is another server or other ports).
#: (By identity: a ``Server`` compares by value, and hashes not.)
_SERVERS: weakref.WeakValueDictionary[int, Server] = weakref.WeakValueDictionary()
#: A stand-in's URL (a relay in front of a worker), and the worker it is described as.
_STAND_INS: dict[str, Server] = {}


def kv_events_config(port: int, replay_port: int) -> dict[str, Any]:
    """A worker's ``--kv-events-config``: ZeroMQ, bound on every interface at ``port``,
    its replay socket at ``replay_port``, every topic."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": "",
    }


@attrs.frozen
class Description:
    """What a worker was started with, as its ``[[workers]]`` table says it."""

    language_model_only: bool
    block_size: int
    kv_transfer_config: Mapping[str, Any] | None = None
    #: It publishes its KV events on its second and third ports.
    events: bool = False
    allowed_media_domains: tuple[str, ...] = ()

    @property
    def capability(self) -> str:
        """What its ``/server_info`` said: a language-model-only KV consumer takes items'
        metadata on vLLM 0.30-0.32, which switch ``enable_mm_embeds`` on for it."""
        if not self.language_model_only:
            return "vision"
        role = (self.kv_transfer_config or {}).get("kv_role")
        return "lm-only+metadata" if role in ("kv_consumer", "kv_both") else "lm-only"

    def table(self, role: str, server: Server, url: str | None = None) -> dict[str, Any]:
        """Its ``[[workers]]`` table in ``role``, on the ports ``server`` runs on, at ``url``
        (``server``'s own by default)."""
        table: dict[str, Any] = {"url": url or server.url, "role": role}
        table["capability"] = self.capability
        if self.kv_transfer_config is not None:
            table["kv_transfer_config"] = dict(self.kv_transfer_config)
        if self.events:
            table["kv_events_config"] = kv_events_config(*server.ports[1:3])
        table["block_size"] = self.block_size
        table["allowed_media_domains"] = list(self.allowed_media_domains)
        return table


def register(server: Server, description: Description) -> Server:
    """Record ``description`` on ``server`` (not yet started), for the proxies put in front
    of it; returned."""
    server.description = description
    _SERVERS[id(server)] = server
    return server


def stand_in(url: str, server: Server) -> None:
    """Describe what answers at ``url`` (a relay in front of ``server``) as ``server``."""
    _STAND_INS[url] = server


def _running(url: str) -> Server | None:
    server = _STAND_INS.get(url)
    if server is not None:
        return server if server.alive() and server.description is not None else None
    return next((s for s in _SERVERS.values() if s.alive() and s.url == url), None)


def _value(value: Any) -> str:
    # TOML's values as the file needs them: strings (JSON's escapes are TOML's basic
    # string's), integers, floats, booleans, arrays and inline tables.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return json.dumps(value)
    if isinstance(value, Sequence):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def toml(workers: Sequence[Mapping[str, Any]]) -> str:
    """``workers`` as a configuration file's ``[[workers]]`` tables; checked to read back
    as they are (``tomllib``)."""
    text = "".join(
        "[[workers]]\n" + "".join(f"{key} = {_value(v)}\n" for key, v in table.items()) + "\n"
        for table in workers
    )
    assert tomllib.loads(text) == {"workers": [dict(t) for t in workers]}, text
    return text


def workers_file(workers: Sequence[tuple[str, str, Server]]) -> Path:
    """The file describing each ``(role, url, server)``, written next to the first
    server's log (named by its content: the same fleet, the same file)."""
    assert workers, "no worker to describe"
    tables = []
    for role, url, server in workers:
        assert isinstance(server.description, Description), server.name
        tables.append(server.description.table(role, server, url))
    text = toml(tables)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    path = workers[0][2].log.parent / f"workers-{digest}.toml"
    path.write_text(text)
    return path


def described_argv(argv: Sequence[str]) -> list[str]:
    """A proxy's flags ``argv`` with every worker flag that names a running described
    worker taken out, and ``--config FILE`` describing them added (a URL is a flag's or
    the file's, never both); ``argv`` as it is when it names none."""
    kept: list[str] = []
    workers: list[tuple[str, str, Server]] = []
    flags = iter(argv)
    for flag in flags:
        name, joined, url = flag.partition("=")
        if name not in ROLE_FLAGS:
            kept.append(flag)
            continue
        url = url if joined else next(flags)
        server = _running(url)
        if server is None:
            kept += [name, url]
        else:
            workers.append((ROLE_FLAGS[name], url, server))
    return [*kept, "--config", str(workers_file(workers))] if workers else kept


def shown(argv: Sequence[str]) -> str:
    """The configuration file a proxy's flags ``argv`` name, and what it says: what an
    operator of the demos would read."""
    if "--config" not in argv:
        return "no configuration file: every worker describes itself"
    path = Path(argv[list(argv).index("--config") + 1])
    return f"the workers, described in {path}:\n{path.read_text().rstrip()}"

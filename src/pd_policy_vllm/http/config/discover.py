"""The names a configuration file has the proxy follow in DNS: ``[[discover]]``, one table
a name. A headless Service's A/AAAA records (each address a worker on ``port``)::

    [[discover]]
    role = "decode"
    name = "vllm-decode.default.svc.cluster.local"
    port = 8000
    capability = "lm-only"
    kv_transfer_config = { kv_connector = "NixlConnector", kv_role = "kv_consumer" }

or its SRV records (``srv = true``: each record a worker at its target and port). The
other keys are a ``[[workers]]`` table's, and describe every worker the name gives.
``interval`` is how often it is resolved (10 s). Which server is asked: ``dns_server``
(the system's resolver by default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from pd_policy_vllm.http.fleet.describe import OperatorSays
from pd_policy_vllm.http.fleet.discovery import DnsSource

from .layers import ConfigError
from .workers import KEYS, WorkerEntry, entry_of

__all__ = ["DISCOVER_KEYS", "DiscoverEntry", "file_discovery"]

#: A ``[[discover]]`` table's own keys; the rest are a ``[[workers]]`` table's but ``url``.
DISCOVER_KEYS: Final = {
    "role": "prefill, decode or encode (required)",
    "name": "the DNS name to follow (required)",
    "port": "the workers' port, for the name's A and AAAA records",
    "srv": "true: read the name's SRV records (a target and a port each)",
    "interval": "seconds between resolutions (10)",
}
_TEMPLATE: Final = tuple(k for k in KEYS if k not in ("url", "role"))


@attrs.frozen(slots=True)
class DiscoverEntry:
    """One ``[[discover]]`` table: how each worker it finds is described (``entry``, its
    URL a placeholder), the name, the A/AAAA port (``None``: SRV) and the interval."""

    entry: WorkerEntry
    name: str
    port: int | None
    interval: float

    @property
    def role(self) -> str:
        return self.entry.role

    def source(self, base: OperatorSays) -> DnsSource:
        """The name to follow, each worker it finds described as the table says, else
        as ``base`` (the flags)."""
        says = self.entry.says(base)
        return DnsSource(self.entry.role, self.name, self.port, self.interval, says)


def _fail(where: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{where}: {key}: {why}", param=key)


def _discover(index: int, table: Any, path: str) -> DiscoverEntry:
    where = f"{path}: discover[{index}]"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: a name to follow is a table", param="discover")
    for key in table:
        if key not in DISCOVER_KEYS and key not in _TEMPLATE:
            raise _fail(where, key, "no such key of [[discover]]")
    name = table.get("name")
    if not isinstance(name, str) or not name:
        raise _fail(where, "name", "a DNS name is needed")
    srv, port = table.get("srv", False), table.get("port")
    if not isinstance(srv, bool):
        raise _fail(where, "srv", "true or false")
    if srv == (port is not None):
        raise _fail(where, "port", "give a port for A/AAAA records, or srv = true, not both")
    if port is not None and (type(port) is not int or not 0 < port < 65536):
        raise _fail(where, "port", f"{port!r} is not a port")
    interval = table.get("interval", 10.0)
    if isinstance(interval, bool) or not isinstance(interval, int | float) or not interval > 0:
        raise _fail(where, "interval", f"{interval!r} is not a positive number of seconds")
    described = {k: v for k, v in table.items() if k in _TEMPLATE or k == "role"}
    entry = entry_of(index, {**described, "url": f"dns://{name}"}, f"{path}: discover")
    return DiscoverEntry(entry, name, port, float(interval))


def file_discovery(file: Mapping[str, Any], path: str) -> tuple[DiscoverEntry, ...]:
    """The names of a configuration file's ``[[discover]]`` tables. Raises
    [`ConfigError`][pd_policy_vllm.http.config.layers.ConfigError] for one that is not
    described right."""
    tables = file.get("discover", [])
    if not isinstance(tables, Sequence) or isinstance(tables, str):
        raise ConfigError(f"{path}: discover: an array of tables ([[discover]])", param="discover")
    return tuple(_discover(i, table, path) for i, table in enumerate(tables))

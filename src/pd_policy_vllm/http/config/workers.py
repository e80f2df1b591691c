"""The workers a configuration file describes: ``[[workers]]``, one table a worker.

Each says what a worker's ``/server_info`` would (so no worker needs vLLM's development
mode), in the words of the ``vllm serve`` flags it runs with::

    [[workers]]
    url = "http://prefill-0:8000"
    role = "prefill"
    kv_transfer_config = { kv_connector = "NixlConnector", kv_role = "kv_producer" }
    kv_events_config = { enable_kv_cache_events = true, publisher = "zmq",
                         endpoint = "tcp://*:5557" }
    block_size = 16
    labels = { zone = "a" }

    [[workers]]
    url = "http://decode-0:8000"
    role = "decode"
    capability = "lm-only"
    kv_transfer_config = { kv_connector = "NixlConnector", kv_role = "kv_consumer" }

A worker's own ``/server_info``, when it serves one, still describes it; the file
speaks for a worker that does not. Errors are one line naming the worker and the key.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from pd_policy import KvConnectorMode
from pd_policy.wires import decode_kv_from_config
from pd_policy_vllm.http.fleet.describe import CAPABILITIES, OperatorSays

from .layers import ConfigError

__all__ = ["CAPABILITY_NAMES", "KEYS", "ROLES", "WorkerEntry", "entry_of", "file_workers"]

#: The roles a worker may have.
ROLES: Final = ("prefill", "decode", "encode")

#: The keys of a worker's table, and what each holds.
KEYS: Final = {
    "url": "its URL (required)",
    "role": "prefill, decode or encode (required)",
    "capability": "vision, lm-only or lm-only+metadata: what it may be sent",
    "kv_transfer_config": "its --kv-transfer-config (a table)",
    "kv_mode": "its handoff contract, when its connector does not say",
    "ec_transfer_config": "its --ec-transfer-config (a table), for E/P/D: its encoder-cache role",
    "bootstrap_port": "its Mooncake bootstrap port",
    "kv_events_config": "its --kv-events-config (a table), for KV routing",
    "block_size": "its --block-size, for KV routing",
    "prefix_caching_hash_algo": "its --prefix-caching-hash-algo, for KV routing",
    "allowed_media_domains": "its --allowed-media-domains (a list; empty: any host)",
    "labels": "names for the operator's own use (a table of strings)",
}

_EC_ROLES: Final = ("ec_producer", "ec_consumer", "ec_both")

#: The names a capability is written as, in the file and in ``--decode-capability``.
CAPABILITY_NAMES: Final = tuple(CAPABILITIES)


@attrs.frozen(slots=True)
class WorkerEntry:
    """One worker of the file, as it describes it (``None``: unsaid)."""

    url: str
    role: str
    capability: str | None = None
    kv_transfer_config: Mapping[str, Any] | None = None
    ec_transfer_config: Mapping[str, Any] | None = None
    kv_mode: KvConnectorMode | None = None
    bootstrap_port: int | None = None
    kv_events_config: Mapping[str, Any] | None = None
    block_size: int | None = None
    prefix_caching_hash_algo: str | None = None
    allowed_media_domains: tuple[str, ...] | None = None
    labels: Mapping[str, str] = attrs.field(factory=dict)

    def vllm_config(self) -> dict[str, Any]:
        """What of a ``vllm_config`` the entry states: the sections the proxy reads a
        prefill's KV connector and KV events from, and a worker's encoder-cache role."""
        cache: dict[str, Any] = {}
        if self.block_size is not None:
            cache["block_size"] = self.block_size
        if self.prefix_caching_hash_algo is not None:
            cache["prefix_caching_hash_algo"] = self.prefix_caching_hash_algo
        return {
            "kv_transfer_config": dict(self.kv_transfer_config or {}),
            "ec_transfer_config": dict(self.ec_transfer_config or {}),
            "kv_events_config": dict(self.kv_events_config or {}),
            "cache_config": cache,
        }

    def says(self, base: OperatorSays) -> OperatorSays:
        """What the operator says of this worker: the entry where it speaks, else
        ``base`` (the flags'), and its ``vllm_config`` as stated."""
        capability = CAPABILITIES[self.capability] if self.capability else base.capability
        decode_kv = base.decode_kv
        if self.kv_transfer_config is not None:
            decode_kv = decode_kv_from_config(self.kv_transfer_config)
        domains = self.allowed_media_domains
        return attrs.evolve(
            base,
            kv_mode=self.kv_mode or base.kv_mode,
            bootstrap_port=self.bootstrap_port or base.bootstrap_port,
            capability=capability,
            allowed_media_domains=domains if domains is not None else base.allowed_media_domains,
            decode_kv=decode_kv,
            stated=self.vllm_config(),
        )


def _fail(where: str, key: str, why: str) -> ConfigError:
    return ConfigError(f"{where}: {key}: {why}", param=key)


def _typed(where: str, table: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = table.get(key)
    if value is None:
        return None
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise _fail(where, key, f"{json.dumps(value, default=str)} is of the wrong type")
    return value


def entry_of(index: int, table: Any, path: str) -> WorkerEntry:
    """The worker of the ``index``-th table of ``path``. Raises as
    [`file_workers`][pd_policy_vllm.http.config.workers.file_workers]."""
    where = f"{path}: workers[{index}]"
    if not isinstance(table, Mapping):
        raise ConfigError(f"{where}: a worker is a table", param="workers")
    for key in table:
        if key not in KEYS:
            raise _fail(where, key, "no such key of a worker (" + ", ".join(KEYS) + ")")
    url = _typed(where, table, "url", str)
    if not url:
        raise _fail(where, "url", "a worker needs its URL")
    where = f"{path}: worker {url}"
    role = _typed(where, table, "role", str)
    if role not in ROLES:
        raise _fail(where, "role", f"{role!r} is not one of {', '.join(ROLES)}")
    capability = _typed(where, table, "capability", str)
    if capability is not None and capability not in CAPABILITY_NAMES:
        names = ", ".join(CAPABILITY_NAMES)
        raise _fail(where, "capability", f"{capability!r} is not one of {names}")
    mode = _typed(where, table, "kv_mode", str)
    try:
        kv_mode = KvConnectorMode(mode) if mode is not None else None
    except ValueError:
        names = ", ".join(m.value for m in KvConnectorMode)
        raise _fail(where, "kv_mode", f"{mode!r} is not one of {names}") from None
    domains = _typed(where, table, "allowed_media_domains", list)
    if domains is not None and not all(isinstance(d, str) for d in domains):
        raise _fail(where, "allowed_media_domains", "a list of host names")
    labels = _typed(where, table, "labels", dict) or {}
    if not all(isinstance(v, str) for v in labels.values()):
        raise _fail(where, "labels", "a table of strings")
    ec = _typed(where, table, "ec_transfer_config", dict)
    if ec is not None and ec.get("ec_role") not in _EC_ROLES:
        raise _fail(where, "ec_transfer_config", "its ec_role is one of " + ", ".join(_EC_ROLES))
    port = _typed(where, table, "bootstrap_port", int)
    block = _typed(where, table, "block_size", int)
    for key, number in (("bootstrap_port", port), ("block_size", block)):
        if number is not None and number < 1:
            raise _fail(where, key, f"{number} is not positive")
    return WorkerEntry(
        url=url,
        role=role,
        capability=capability,
        kv_transfer_config=_typed(where, table, "kv_transfer_config", dict),
        ec_transfer_config=ec,
        kv_mode=kv_mode,
        bootstrap_port=port,
        kv_events_config=_typed(where, table, "kv_events_config", dict),
        block_size=block,
        prefix_caching_hash_algo=_typed(where, table, "prefix_caching_hash_algo", str),
        allowed_media_domains=tuple(domains) if domains is not None else None,
        labels=dict(labels),
    )


def file_workers(file: Mapping[str, Any], path: str) -> tuple[WorkerEntry, ...]:
    """The workers of a configuration file's top-level table. Raises
    [`ConfigError`][pd_policy_vllm.http.config.layers.ConfigError] for a worker that is
    not described right, or a URL given twice in one role."""
    tables = file.get("workers", [])
    if not isinstance(tables, Sequence) or isinstance(tables, str):
        raise ConfigError(f"{path}: workers: an array of tables ([[workers]])", param="workers")
    entries = tuple(entry_of(i, table, path) for i, table in enumerate(tables))
    seen: set[tuple[str, str]] = set()
    for entry in entries:
        if (entry.role, entry.url) in seen:
            raise _fail(f"{path}: worker {entry.url}", "role", f"{entry.role} given twice")
        seen.add((entry.role, entry.url))
    return entries

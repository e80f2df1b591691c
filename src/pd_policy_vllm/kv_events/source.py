"""Where a worker publishes its KV events, and how it names its blocks: read from its
configuration (its ``/server_info``, or the engine's ``VllmConfig`` as JSON).

A worker's events are usable for routing only when they describe the prefix cache a
request will hit, and when the router can compute the same block names:

- prefix caching on, events on, published by vLLM's ZeroMQ publisher;
- a PUB socket the worker *binds* (``tcp://*:PORT``; an endpoint with a host makes the
  worker connect out, to a subscriber that binds, which this router does not run), read
  on the worker's own host: the host is the one the operator named, never one the worker
  says (a worker's configuration is not trusted to send the router elsewhere);
- one data-parallel rank (each rank publishes its own stream and caches its own blocks;
  a router that sees only one would count blocks another rank holds);
- blocks named at the granularity they are cached (no ``--prefix-match-unit`` finer
  than the block size);
- a hash algorithm the core computes (``sha256`` or ``sha256_cbor``,
  [`HashAlgo`][pd_policy.cache.kv_blocks.HashAlgo]).

Anything else gives ``None`` with the reason: the worker is then routed by today's rules
(affinity, load), never by guesses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from pd_policy.authority import host_of_url
from pd_policy.cache.kv_blocks import HashAlgo

__all__ = ["KvSource", "kv_source_from_config"]


@attrs.frozen(slots=True)
class KvSource:
    """A worker's KV events: its PUB ``endpoint`` (``tcp://host:port``), its replay
    socket's (``None``: it keeps none), the ``topic`` it publishes on, and how it names
    blocks: ``block_size`` tokens a block, ``algo``."""

    endpoint: str
    replay: str | None
    topic: str
    block_size: int
    algo: HashAlgo


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name)
    return value if isinstance(value, Mapping) else {}


def _port(endpoint: object) -> int | None:
    # Only an endpoint the worker binds on every interface: "tcp://*:5557" (or "::").
    if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
        return None
    host, _, port = endpoint[len("tcp://") :].rpartition(":")
    if host not in ("*", "::", "[::]", "0.0.0.0") or not port.isdigit():
        return None
    number = int(port)
    return number if 0 < number < 65536 else None


def _tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def kv_source_from_config(config: Mapping[str, Any], url: str) -> tuple[KvSource | None, str]:
    """The KV events of the worker at ``url`` whose configuration is ``config`` (its
    ``vllm_config``), and why not when ``None`` (see the module docs); the reason is
    ``""`` when there is a source."""
    events = _section(config, "kv_events_config")
    cache = _section(config, "cache_config")
    parallel = _section(config, "parallel_config")
    host = host_of_url(url)
    if events.get("enable_kv_cache_events") is not True or events.get("publisher") != "zmq":
        return None, "its KV events are off (--kv-events-config)"
    if cache.get("enable_prefix_caching") is False:
        return None, "its prefix caching is off"
    size = cache.get("block_size")
    if type(size) is not int or size < 1:
        return None, "it does not state its block size"
    finer = (cache.get(key) for key in ("hash_block_size", "prefix_match_unit"))
    if any(type(unit) is int and unit != size for unit in finer):
        return None, "it names its blocks at another granularity than its block size"
    try:
        algo = HashAlgo(cache.get("prefix_caching_hash_algo", HashAlgo.SHA256.value))
    except ValueError:
        return None, "its prefix-caching hash algorithm is not sha256 or sha256_cbor"
    if (parallel.get("data_parallel_size") or 1) != 1:
        return None, "it runs more than one data-parallel rank"
    port = _port(events.get("endpoint"))
    if port is None or host is None:
        return None, "its events endpoint is not bound on tcp://*:PORT"
    replay_port = _port(events.get("replay_endpoint"))
    topic = events.get("topic")
    return (
        KvSource(
            _tcp(host, port),
            _tcp(host, replay_port) if replay_port is not None else None,
            topic if isinstance(topic, str) else "",
            size,
            algo,
        ),
        "",
    )

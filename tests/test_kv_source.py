"""Where a worker's KV events are read, from its configuration: only a feed the router can
follow exactly, on the host the operator named, never one the worker says."""

from __future__ import annotations

from typing import Any

import pytest

from pd_policy.cache.kv_blocks import HashAlgo
from pd_policy_vllm.kv_events.source import KvSource, kv_source_from_config


def config(**changes: Any) -> dict[str, Any]:
    """A served prefill's ``vllm_config`` with KV events on, as ``/server_info`` gives it;
    ``changes`` replace whole sections' keys (``section__key=value``)."""
    out: dict[str, Any] = {
        "kv_events_config": {"enable_kv_cache_events": True, "publisher": "zmq",
                             "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
                             "topic": "kv"},
        "cache_config": {"block_size": 32, "enable_prefix_caching": True,
                         "prefix_caching_hash_algo": "sha256_cbor"},
        "parallel_config": {"data_parallel_size": 1},
    }  # fmt: skip
    for name, value in changes.items():
        section, _, key = name.partition("__")
        out[section][key] = value
    return out


def test_a_worker_that_publishes_is_read_on_the_operators_host() -> None:
    source, why = kv_source_from_config(config(), "http://10.0.0.7:8000")
    assert why == ""
    assert source == KvSource(
        "tcp://10.0.0.7:5557", "tcp://10.0.0.7:5558", "kv", 32, HashAlgo.SHA256_CBOR
    )


def test_an_ipv6_worker_is_read_in_brackets() -> None:
    source, _ = kv_source_from_config(config(), "http://[fd00::7]:8000")
    assert source is not None and source.endpoint == "tcp://[fd00::7]:5557"


def test_without_a_replay_socket_there_is_none_and_the_default_algo_is_sha256() -> None:
    changed = config(kv_events_config__replay_endpoint=None)
    del changed["cache_config"]["prefix_caching_hash_algo"]
    source, _ = kv_source_from_config(changed, "http://h:1")
    assert source is not None and source.replay is None and source.algo is HashAlgo.SHA256


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"kv_events_config__enable_kv_cache_events": False}, "KV events are off"),
        ({"kv_events_config__publisher": "null"}, "KV events are off"),
        ({"cache_config__enable_prefix_caching": False}, "prefix caching is off"),
        ({"cache_config__block_size": None}, "block size"),
        ({"cache_config__block_size": "32"}, "block size"),
        ({"cache_config__hash_block_size": 16}, "another granularity"),
        ({"cache_config__prefix_caching_hash_algo": "xxhash"}, "not sha256"),
        ({"parallel_config__data_parallel_size": 2}, "data-parallel"),
        # A host in the endpoint: the worker connects out to it, to a subscriber the
        # router does not run, and a router must never be sent to a host a worker names.
        ({"kv_events_config__endpoint": "tcp://203.0.113.9:5557"}, "tcp://*:PORT"),
        ({"kv_events_config__endpoint": "ipc:///tmp/kv"}, "tcp://*:PORT"),
        ({"kv_events_config__endpoint": "tcp://*:99999"}, "tcp://*:PORT"),
        ({"kv_events_config__endpoint": "tcp://*:"}, "tcp://*:PORT"),
    ],
)
def test_a_feed_the_router_cannot_follow_exactly_is_none_with_the_reason(
    changes: dict[str, Any], reason: str
) -> None:
    source, why = kv_source_from_config(config(**changes), "http://10.0.0.7:8000")
    assert source is None and reason in why


def test_a_replay_endpoint_that_names_a_host_is_not_followed() -> None:
    changed = config(kv_events_config__replay_endpoint="tcp://203.0.113.9:5558")
    source, _ = kv_source_from_config(changed, "http://10.0.0.7:8000")
    assert source is not None and source.replay is None


def test_a_configuration_of_the_wrong_shape_is_no_source() -> None:
    for hostile in ({}, {"kv_events_config": "on"}, {"kv_events_config": None}):
        assert kv_source_from_config(hostile, "http://h:1")[0] is None

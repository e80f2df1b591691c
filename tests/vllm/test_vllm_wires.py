"""The KV wires against vLLM itself, in-process and without an engine: every connector vLLM
registers is served or refused by the core's table, and the fields the core reads of a
worker's ``kv_transfer_config`` are the ones vLLM parses and ``/server_info`` dumps."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from pd_policy.connectors import KvConnectorMode
from pd_policy.decode_kv import KvLoad, LoadFailure
from pd_policy.errors import InvalidConfiguration
from pd_policy.wires import CONNECTORS, decode_kv_from_config, handoff_mode

P2P = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": 2**30,
       "secondary_tiers": [{"type": "p2p", "host": "127.0.0.1", "port": 5701}]}  # fmt: skip


def test_every_connector_vllm_registers_is_served_or_refused_by_name() -> None:
    registered = set(KVConnectorFactory._registry)
    assert registered, "vLLM's factory registers no connector: the test reads the wrong table"
    assert registered - set(CONNECTORS) == set()
    for name in registered:  # each is served with a contract, or refused with a reason
        wire = CONNECTORS[name]
        assert (wire.mode is not None) != bool(wire.why), name


def _dumped(**fields: Any) -> dict[str, Any]:
    # As /server_info?config_format=json dumps a VllmConfig's kv_transfer_config.
    config = KVTransferConfig(**fields)
    dumped: dict[str, Any] = TypeAdapter(KVTransferConfig).dump_python(config, mode="json")
    return dumped


@pytest.mark.parametrize(
    ("fields", "loads", "on_failure"),
    [
        ({"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}, KvLoad.BY_REQUEST,
         LoadFailure.FAIL),  # vLLM's default policy
        ({"kv_connector": "NixlConnector", "kv_role": "kv_consumer",
          "kv_load_failure_policy": "recompute"}, KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE),
        ({"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
          "kv_connector_extra_config": P2P}, KvLoad.BY_CONTENT, LoadFailure.FAIL),
        ({}, KvLoad.NONE, LoadFailure.FAIL),
    ],
)  # fmt: skip
def test_the_core_reads_what_vllm_parses(
    fields: dict[str, Any], loads: KvLoad, on_failure: LoadFailure
) -> None:
    dumped = _dumped(**fields)
    assert dumped["kv_load_failure_policy"] == fields.get("kv_load_failure_policy", "fail")
    kv = decode_kv_from_config(dumped)
    assert (kv.loads, kv.on_failure) == (loads, on_failure)


def test_a_p2p_tier_and_push_read_from_vllms_own_dump() -> None:
    p2p = _dumped(kv_connector="OffloadingConnector", kv_role="kv_both",
                  kv_connector_extra_config=P2P)  # fmt: skip
    with pytest.raises(InvalidConfiguration, match="p2p"):
        handoff_mode(p2p)
    push = _dumped(kv_connector="NixlPushConnector", kv_role="kv_producer")
    assert handoff_mode(push) is KvConnectorMode.NIXL_PUSH
    children = [{"kv_connector": "NixlConnector", "kv_role": "kv_both"},
                {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}]  # fmt: skip
    multi = _dumped(kv_connector="MultiConnector", kv_role="kv_both",
                    kv_connector_extra_config={"connectors": children})  # fmt: skip
    assert handoff_mode(multi) is KvConnectorMode.NIXL
    assert decode_kv_from_config(multi).loads is KvLoad.BY_REQUEST

"""What the cases share: the decode workers by kind (a column of the decision table each),
a complete handoff under each contract, and a request as its JSON."""

from __future__ import annotations

from typing import Any, Final

from pd_policy.codec import request_to_json
from pd_policy.connectors import KvConnectorMode
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy.request import Request
from pd_policy.worker import Support, WorkerCapability

__all__ = ["COMPLETE_HANDOFFS", "NIXL", "WORKERS", "req"]

WORKERS: Final = {
    "vision": WorkerCapability(Support.TRUE),
    "unknown": WorkerCapability(Support.UNKNOWN),
    "lm_only": WorkerCapability(Support.FALSE),
    "lm_only_metadata": WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE),
    # Blind to a stripped leg: its connector matches by content hash; it recomputes a
    # failed load.
    "lm_only_content": WorkerCapability(Support.FALSE, decode_kv=DecodeKv(KvLoad.BY_CONTENT)),
    "lm_only_metadata_recompute": WorkerCapability(
        Support.FALSE,
        accepts_mm_metadata=Support.TRUE,
        decode_kv=DecodeKv(KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE),
    ),
}
#: What a NIXL prefill returns, complete: every field vLLM 0.32's ``NixlConnector`` returns,
#: each of the JSON type it returns (a live test compares them,
#: ``tests/vllm/http/test_http_nixl_live.py``); the contract requires the fields of
#: ``REQUIRED_KV_FIELDS[NIXL]``. The blocks are a list per KV cache group.
NIXL: Final = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[0, 1]],
    "remote_engine_id": "p0",
    "remote_request_id": "chatcmpl-req-1",
    "remote_host": "p0.local",
    "remote_port": 5600,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 23,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
    "remote_prefill_cached_tokens": 0,
}

#: A complete handoff under each contract, to drop one field from at a time.
COMPLETE_HANDOFFS: Final[dict[KvConnectorMode, dict[str, object]]] = {
    KvConnectorMode.NIXL: NIXL,
    KvConnectorMode.NIXL_PUSH: {**NIXL, "transfer_mode": "push"},
    KvConnectorMode.TRANSFER: {"do_remote_prefill": True, "transfer_id": "xfer-1"},
    KvConnectorMode.MOONCAKE: {
        "do_remote_prefill": True,
        "transfer_id": "xfer-1",
        "remote_engine_id": "p0",
        "remote_bootstrap_addr": "http://p0.local:8998",
    },
    KvConnectorMode.PASSTHROUGH: {"loaded_from": "store"},
}


def req(request: Request) -> dict[str, Any]:
    return request_to_json(request)

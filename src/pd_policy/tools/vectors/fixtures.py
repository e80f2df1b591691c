"""What the cases share: the decode workers by kind, a complete NIXL handoff, and a request
as its JSON."""

from __future__ import annotations

from typing import Any, Final

from pd_policy.codec import request_to_json
from pd_policy.request import Request
from pd_policy.worker import Support, WorkerCapability

__all__ = ["NIXL", "WORKERS", "req"]

WORKERS: Final = {
    "vision": WorkerCapability(Support.TRUE),
    "unknown": WorkerCapability(Support.UNKNOWN),
    "lm_only": WorkerCapability(Support.FALSE),
    "lm_only_metadata": WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE),
}
#: What a NIXL prefill returns, complete (the fields of ``REQUIRED_KV_FIELDS[NIXL]``).
NIXL: Final = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "p0",
    "remote_block_ids": [0, 1],
    "remote_host": "p0.local",
    "remote_port": 5600,
}


def req(request: Request) -> dict[str, Any]:
    return request_to_json(request)

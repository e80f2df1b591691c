"""The HTTP conformance cases of the KV handoff's fields: a handoff is one only with the
fields its connector's contract names, so ``{}``, or a NIXL handoff without its blocks,
is the 502 on a stripped leg, never an image-blind 200; a text leg recomputes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

__all__ = ["NIXL_RETURNED", "TRANSFER", "handoff_cases"]

#: A NIXL prefill's handoff, complete: the workers' contract in most cases is NIXL. Every
#: field vLLM 0.32's ``NixlConnector`` returns, each of the JSON type it returns (a live test
#: compares them, ``tests/vllm/http/test_http_nixl_live.py``).
NIXL_RETURNED: Final = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[0, 1]],
    "remote_engine_id": "p-1",
    "remote_request_id": "chatcmpl-req-1",
    "remote_host": "p-1.local",
    "remote_port": 5600,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 23,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
    "remote_prefill_cached_tokens": 0,
}

#: What the project's TransferConnector returns: complete for its contract, not NIXL's.
TRANSFER: Final = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "t-1"}


def handoff_cases(
    add: Callable[..., None], *, image: dict[str, Any], text: dict[str, Any], ids: list[int]
) -> None:
    """Add, through ``add`` (the vectors' case builder), each contract's empty and
    complete handoff for ``image``, the TransferConnector's handoff under NIXL, and an
    empty one for ``text``."""
    for contract, label, returned, body in (
        ("nixl", "empty", {}, image),
        ("nixl", "transfer_shaped", TRANSFER, image),
        ("nixl", "text_empty", {}, text),
        ("transfer", "empty", {}, image),
        ("transfer", "complete", TRANSFER, image),
        ("passthrough", "empty", {}, image),
        ("passthrough", "any", {"x": 1}, image),
    ):
        add(
            f"chat/handoff/{contract}/{label}",
            f"a {label} handoff under {contract}",
            body,
            prefill_kv={"mode": contract},
            response={"prompt_token_ids": ids, "kv_transfer_params": returned},
        )

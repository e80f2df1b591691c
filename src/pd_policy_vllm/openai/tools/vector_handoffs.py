"""The HTTP conformance cases of the KV handoff's fields: a handoff is one only with the
fields its connector's contract names, so ``{}``, or a NIXL handoff without its blocks,
is the 502 on a stripped leg, never an image-blind 200; a text leg recomputes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pd_policy.tools.vectors.fixtures import NIXL

__all__ = ["NIXL_RETURNED", "TRANSFER", "handoff_cases"]

#: A NIXL prefill's handoff, complete: the workers' contract in most cases is NIXL. The
#: conformance vectors' NIXL handoff (every field vLLM 0.32's ``NixlConnector`` returns, of
#: the JSON type it returns), from another engine.
NIXL_RETURNED: Final = {**NIXL, "remote_engine_id": "p-1", "remote_host": "p-1.local"}

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

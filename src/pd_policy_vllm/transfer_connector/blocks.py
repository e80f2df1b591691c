"""The transfer store: what a step copies, and the copies themselves, block by block.

Whole blocks are copied: the CPU attention backend lays a block out as all
keys then all values, so per-token slicing of a block is wrong, and a block
copy is layout-agnostic. Each layer's blocks of a transfer are one
safetensors file under ``transfer_dir/<transfer id>/``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

__all__ = ["Copy", "TransferMetadata", "load_blocks", "prompt_digest", "save_blocks"]


def prompt_digest(token_ids: list[int] | tuple[int, ...]) -> str:
    """A short digest of a prompt: the decode prompt must be exactly the prefill's ids."""
    return hashlib.sha256(json.dumps(list(token_ids)).encode()).hexdigest()[:32]


@dataclass
class Copy:
    """One transfer's blocks to copy this step, in one direction."""

    transfer_id: str
    block_ids: list[int]
    store: bool
    #: For a load: the index, in the stored blocks, of the first block to load.
    first_block: int = 0


@dataclass
class TransferMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """What the worker side does this step: everything it needs, nothing it keeps."""

    transfer_dir: str = ""
    copies: list[Copy] = field(default_factory=list)


@dataclass
class _Producing:
    transfer_id: str
    prompt: list[int]
    block_ids: list[int] = field(default_factory=list)


@dataclass
class _Stored:
    transfer_id: str
    num_tokens: int
    digest: str


@dataclass
class _Load:
    transfer_id: str
    start: int
    end: int
    local_cached_tokens: int


def load_blocks(directory: Path, loads: list[Copy], layers: dict[str, Any]) -> None:
    """Copy each load's stored blocks into every attention layer's KV cache."""
    for name, layer in layers.items():
        kv = getattr(layer, "kv_cache", None)
        if not isinstance(kv, torch.Tensor):
            continue
        for load in loads:
            path = directory / load.transfer_id / f"{name}.safetensors"
            stored = safetensors.torch.load_file(str(path))["kv_cache"]
            count = len(load.block_ids)
            index = torch.tensor(load.block_ids, dtype=torch.long)
            kv[index] = stored[load.first_block : load.first_block + count].to(kv.dtype)


def save_blocks(directory: Path, stores: list[Copy], layer_name: str, kv_layer: Any) -> None:
    """Save one layer's blocks of each store, under its transfer id."""
    for copy in stores:
        target = directory / copy.transfer_id
        target.mkdir(parents=True, exist_ok=True)
        index = torch.tensor(copy.block_ids, dtype=torch.long)
        blocks = kv_layer[index].detach().cpu().contiguous()
        safetensors.torch.save_file({"kv_cache": blocks}, str(target / f"{layer_name}.safetensors"))

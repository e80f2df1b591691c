"""A batch of vLLM's KV events, from the bytes a worker published.

A worker sends each batch as three frames: its topic, its number (8 bytes, big-endian),
and the batch, msgpack: ``[ts, events, data_parallel_rank?]``, each event a map tagged by
its ``type`` (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``; vLLM's
``distributed/kv_events.py``). Only what the index needs is read: the hashes, and the
tier a block is in (``medium``). A block stored or removed on another tier than the
device's (an offloading connector's ``CPU``) says nothing of the prefix cache a prefill
reads first, and is left out; so are the blocks of a KV cache group but the first (a
hybrid model's sliding-window groups). The frames are input from the network: a batch
that is not one raises, and the caller counts it lost.
"""

from __future__ import annotations

from typing import Final

import msgspec

from pd_policy.cache.prefix_index import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent

__all__ = ["END_OF_REPLAY", "WireBatch", "read_batch", "read_seq"]

#: The number a replay's last message carries: no batch follows.
END_OF_REPLAY: Final = b"\xff" * 8
_DEVICE: Final = (None, "GPU")

Hash = int | bytes


class _Stored(msgspec.Struct, tag="BlockStored"):
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None


class _Removed(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: list[Hash]
    medium: str | None = None
    group_idx: int | None = None


class _Cleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


class WireBatch(msgspec.Struct, array_like=True):
    """A batch as published: when it was made (the worker's clock), its events, and the
    data-parallel rank that made it."""

    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


_DECODER: Final = msgspec.msgpack.Decoder(WireBatch)


def read_seq(frame: bytes) -> int:
    """A batch's number, from its frame. Raises ``ValueError`` for a frame that is not
    8 bytes."""
    if len(frame) != 8:
        raise ValueError("a batch number is 8 bytes")
    return int.from_bytes(frame, "big")


def read_batch(payload: bytes) -> tuple[float, list[KvEvent]]:
    """The batch's time and its events, as the core's types, device tier and first group
    only. Raises ``ValueError`` (``msgspec``'s decode errors are ones) for bytes that are
    not a batch of these events."""
    batch = _DECODER.decode(payload)
    events: list[KvEvent] = []
    for event in batch.events:
        if isinstance(event, _Cleared):
            events.append(AllBlocksCleared())
        elif event.medium in _DEVICE and event.group_idx in (None, 0):
            kind = BlockStored if isinstance(event, _Stored) else BlockRemoved
            events.append(kind(event.block_hashes))
    return batch.ts, events

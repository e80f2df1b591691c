"""vLLM's prefix-cache block identities, computed as a worker computes them.

A vLLM worker caches KV in blocks of ``block_size`` tokens and names each full block by
a hash chained from the one before: ``hash((parent, tokens, extra_keys))``, the first
block's parent a fixed ``NONE_HASH``. The extra keys make the name exact in what the
tokens do not say: each multimodal item the block overlaps (``("mm", identifier,
offset in the block)``: two images behind one placeholder run never share a block), the
request's ``cache_salt`` on the first block (two tenants never share a prefix), and a
LoRA adapter (``("lora", name, path)``). Its KV events publish each block's hash, by
default as the low 64 bits (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).

[`BlockHasher`][pd_policy.cache.kv_blocks.BlockHasher] computes the same chain for a request
whose expanded token ids and multimodal placements are known (a router that rendered
it, or a tokenized gRPC request), so that a router can ask which worker holds its
leading blocks. It must be set as the workers are: their block size, their
``--prefix-caching-hash-algo`` (``sha256``, the default, or ``sha256_cbor``) and the seed
of ``NONE_HASH`` (``PYTHONHASHSEED`` when they set it, else vLLM's fixed
``vllm-none-hash``). The non-cryptographic ``xxhash`` algorithms draw a random seed per
process unless ``PYTHONHASHSEED`` is set, and are not supported.

``sha256`` hashes a pickle, in which an object seen twice is written as a reference:
the hasher builds every key as a served worker holds it (each item's identifier a
string of its own), which a worker run in-process does not (vLLM's
``VLLM_ENABLE_V1_MULTIPROCESSING=0``). ``sha256_cbor`` has no such subtlety. Pure:
stdlib and attrs.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import pickle
from collections.abc import Sequence
from typing import Any, Final

import attrs

from ..errors import InvalidConfiguration, MalformedRequest

__all__ = [
    "DEFAULT_NONE_HASH_SEED",
    "BlockHasher",
    "HashAlgo",
    "MmSpan",
    "block_hasher",
    "external_hash",
]

#: vLLM's seed of ``NONE_HASH`` for the cryptographic algorithms, without PYTHONHASHSEED.
DEFAULT_NONE_HASH_SEED: Final = "vllm-none-hash"
_LOW_64: Final = (1 << 64) - 1
_TOKEN_LIMIT: Final = 1 << 32


class HashAlgo(enum.Enum):
    """The ``--prefix-caching-hash-algo`` values a router can follow."""

    SHA256 = "sha256"
    SHA256_CBOR = "sha256_cbor"


@attrs.frozen(slots=True)
class MmSpan:
    """A multimodal item's place in the expanded prompt: its ``identifier`` (the hash
    vLLM names it by, as a render reports it), the ``offset`` of its placeholder run and
    its ``length``."""

    identifier: str
    offset: int
    length: int

    def __attrs_post_init__(self) -> None:
        if not self.identifier or self.offset < 0 or self.length < 1:
            raise MalformedRequest("a media item's placement is not a range", param="mm")


def external_hash(block_hash: bytes | int) -> int:
    """A block hash as a worker's KV events publish it by default: its low 64 bits (an
    event's hash already an ``int`` is taken as it is)."""
    if isinstance(block_hash, int):
        return block_hash & _LOW_64
    return int.from_bytes(block_hash, "big") & _LOW_64


def _cbor_head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    for extra, size in ((24, 1), (25, 2), (26, 4), (27, 8)):
        if value < 1 << (8 * size):
            return bytes([major << 5 | extra]) + value.to_bytes(size, "big")
    raise MalformedRequest("an integer beyond CBOR's 64 bits", param="token_ids")


def _cbor(value: Any, out: bytearray) -> None:
    # Canonical CBOR (RFC 8949's core deterministic encoding) of the values a block key
    # holds: what cbor2.dumps(value, canonical=True) writes for them.
    if value is None:
        out.append(0xF6)
    elif isinstance(value, bool):
        out.append(0xF5 if value else 0xF4)
    elif isinstance(value, int):
        out += _cbor_head(0, value) if value >= 0 else _cbor_head(1, -1 - value)
    elif isinstance(value, bytes):
        out += _cbor_head(2, len(value)) + value
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += _cbor_head(3, len(raw)) + raw
    elif isinstance(value, tuple | list):
        out += _cbor_head(4, len(value))
        for item in value:
            _cbor(item, out)
    else:
        raise TypeError(f"no CBOR here for {type(value).__name__}")


def _fresh(text: str) -> str:
    # A string object of its own, as a served worker holds each key it decoded: in a
    # pickle, one object met twice is a reference, two equal objects are written twice.
    return text.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")


@attrs.frozen(slots=True)
class BlockHasher:
    """The block identities of a worker with ``block_size``, ``algo`` and ``seed`` (its
    ``PYTHONHASHSEED``; ``None``: vLLM's default). Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a block size
    that is not positive."""

    block_size: int
    algo: HashAlgo = HashAlgo.SHA256
    seed: str | None = None
    none_hash: bytes = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        if type(self.block_size) is not int or self.block_size < 1:
            raise InvalidConfiguration("a block size is a positive integer", param="block_size")
        seed = self.seed if self.seed is not None else DEFAULT_NONE_HASH_SEED
        object.__setattr__(self, "none_hash", self._hash(seed))

    def _hash(self, value: Any) -> bytes:
        if self.algo is HashAlgo.SHA256:
            data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            buffer = bytearray()
            _cbor(value, buffer)
            data = bytes(buffer)
        return hashlib.sha256(data).digest()

    def hashes(
        self,
        token_ids: Sequence[int],
        mm: Sequence[MmSpan] = (),
        *,
        cache_salt: str | None = None,
        lora: tuple[str, str] | None = None,
    ) -> list[bytes]:
        """The hash of each full block of a prompt of ``token_ids`` (expanded: every
        placeholder run at its length) whose multimodal items are ``mm``, with
        ``cache_salt`` and a LoRA adapter (``(name, path)``): what the worker names
        them. Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a token
        id that is not an index below 2**32, and for items that overlap or run past the
        prompt."""
        if not all(type(t) is int and 0 <= t < _TOKEN_LIMIT for t in token_ids):
            raise MalformedRequest("a token id is not a vocabulary index", param="token_ids")
        spans = sorted(mm, key=lambda span: span.offset)
        end = 0
        for span in spans:
            if span.offset < end or span.offset + span.length > len(token_ids):
                raise MalformedRequest("media items overlap or run past the prompt", "mm")
            end = span.offset + span.length
        size, parent, out = self.block_size, self.none_hash, []
        item = 0
        for start in range(0, len(token_ids) - size + 1, size):
            stop = start + size
            keys: list[tuple[Any, ...]] = []
            if lora is not None:
                keys.append(("lora", _fresh(lora[0]), _fresh(lora[1])))
            while item < len(spans) and spans[item].offset + spans[item].length <= start:
                item += 1  # ended before this block
            at = item
            while at < len(spans) and spans[at].offset < stop:
                keys.append(("mm", _fresh(spans[at].identifier), spans[at].offset - start))
                at += 1
            if start == 0 and cache_salt:
                keys.append(("cache_salt", _fresh(cache_salt)))
            block = tuple(token_ids[start:stop])
            parent = self._hash((parent, block, tuple(keys) if keys else None))
            out.append(parent)
        return out


@functools.lru_cache(maxsize=64)
def block_hasher(
    block_size: int, algo: HashAlgo = HashAlgo.SHA256, seed: str | None = None
) -> BlockHasher:
    """The [`BlockHasher`][pd_policy.cache.kv_blocks.BlockHasher] of workers set so, made once
    (its ``NONE_HASH`` is a hash): a router asks for it on every request. Raises as the
    constructor does."""
    return BlockHasher(block_size, algo, seed)

"""A ``GenerateRequest``'s prompt as an SMG vLLM servicer hands it to its engine: what
the engine names its prefix-cache blocks by.

A router that follows a prefill's KV events ([`kv_routing`][pd_policy_grpc.kv_routing])
computes the request's block hashes itself
([`BlockHasher`][pd_policy.cache.kv_blocks.BlockHasher]) from the token ids, each media item's
identifier and placeholder run, and the cache salt the engine sees. The servicer
(``smg-grpc-servicer`` 0.14, its ``Generate``) builds that prompt in one of three ways,
and so does [`block_prompt`][pd_policy_grpc.blocks.block_prompt]:

- **preprocessed media** (a batch with ``pixel_values`` or model-specific tensors): the
  ids as sent, already expanded; one item per placeholder of each such batch, its
  identifier the batch's ``mm_hashes`` entry *verbatim* (vLLM's input processor names a
  feature by the hash it is given, ``MultiModalFeatureSpec.identifier``, prefixed only
  under a tower-connector LoRA, which a gRPC request cannot ask for); no salt. A batch
  without a payload beside them is not read by the servicer, and not here;
- **tokens with bare identities** (batches of hashes, no payload: a decode leg's form):
  the ids, no item, and the salt ``"mm:" + ",".join(hashes)`` of every batch
  ([`upstream_cache_salt`][pd_policy.salt.upstream_cache_salt]);
- **tokens alone**: the ids, no item, no salt.

The wire has no ``cache_salt`` and no LoRA field, so nothing else enters the names. A
request the router cannot name as the engine will is not looked up (``None``): text (the
worker tokenizes), media references (the worker expands the placeholders and names the
items), ``truncate_prompt_tokens`` (the engine may cut the ids), and a payload batch
whose hashes do not pair one to one with its placeholders.
"""

from __future__ import annotations

import attrs

from pd_policy import upstream_cache_salt
from pd_policy.cache.kv_blocks import MmSpan

from .view import batches_with_paths
from .wire import pb

__all__ = ["BlockPrompt", "block_prompt"]


@attrs.frozen(slots=True)
class BlockPrompt:
    """A prompt as the engine names its blocks: the expanded ``token_ids``, the media
    ``items`` in it, and its ``cache_salt``."""

    token_ids: tuple[int, ...]
    items: tuple[MmSpan, ...] = ()
    cache_salt: str | None = None


def _has_payload(batch: pb.MultimodalInputs) -> bool:
    # Presence only: under upb, reading a payload copies it.
    return batch.HasField("pixel_values") or len(batch.model_specific_tensors) > 0


def block_prompt(request: pb.GenerateRequest) -> BlockPrompt | None:
    """What the engine behind an SMG servicer names ``request``'s blocks by (see the
    module docs); ``None`` when the router cannot know it. Reads no payload (a bytes
    router's skeleton serves as well as the message). Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a placeholder that is not
    a range (a request [`check_generate_request`][pd_policy_grpc.facts.check_generate_request]
    passed has none)."""
    if request.WhichOneof("input") != "tokenized" or request.HasField("media_refs"):
        return None
    if request.sampling_params.HasField("truncate_prompt_tokens"):
        return None
    ids = tuple(request.tokenized.input_ids)
    batches = [batch for _, batch in batches_with_paths(request)]
    loaded = [batch for batch in batches if _has_payload(batch)]
    if not loaded:
        salt = upstream_cache_salt(h for batch in batches for h in batch.mm_hashes)
        return BlockPrompt(ids, (), salt)
    items: list[MmSpan] = []
    for batch in loaded:
        hashes, placeholders = batch.mm_hashes[:], batch.mm_placeholders[:]
        if not hashes or len(hashes) != len(placeholders):
            return None  # the engine would fail it, or pair them otherwise
        items += (MmSpan(h, p.offset, p.length) for h, p in zip(hashes, placeholders, strict=True))
    return BlockPrompt(ids, tuple(items))

"""The engine input for an M-RoPE metadata leg: the prefill-expanded ids, and per item its
grid, content hash and placeholder range, and no pixels.

vLLM 0.32 accepts such an item on a KV consumer whose config allows missing
embeddings: it computes the image's rotary positions from the grid, keys the
prefix cache by the hash, and never encodes the image once the connector has
loaded the prompt's KV. The input is pre-rendered, as vLLM's own
``/inference/v1/generate`` builds it for a request with ``features``: a
``TokensPrompt`` of expanded ids with image data would be expanded a second
time (16 image ids became 31, measured).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pd_policy import MROPE_GRID_KEYS, MalformedRequest, Request, decode_cache_salt

__all__ = ["GridValues", "metadata_engine_input"]

#: Per batch of the leg, the values of its tensors by name (torch tensors or nested lists).
GridValues = Sequence[Mapping[str, Any]]

#: Grids with one row of (t, h, w) per item; the others have one value per item.
_THW: frozenset[str] = frozenset({"image_grid_thw", "video_grid_thw"})


def _fail(message: str, param: str) -> MalformedRequest:
    return MalformedRequest(message, param=param)


def metadata_engine_input(leg: Request, grids: GridValues) -> dict[str, Any]:
    """vLLM's pre-rendered multimodal input for the metadata leg ``leg``.

    ``grids`` gives, per batch of the leg, the values of the tensors the leg
    keeps: its M-RoPE grids, and the sizes tensor of a flattened grid. The
    leg's descriptors say which tensors exist; the values come from the router
    (the prefill's own grids). ``cache_salt`` is
    [`pd_policy.decode_cache_salt`][pd_policy.salt.decode_cache_salt] of the leg: the caller's salt.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (naming ``grids[i].name``) when
    a batch's values are missing or do not match its descriptors: a
    ``*_grid_thw`` that is not one ``(t, h, w)`` row per item (vLLM refuses a
    1-D grid), a per-item grid of the wrong length, a tensor the leg does not
    name, or two batches of one modality that name the same tensor.
    """
    import torch
    from transformers import BatchFeature
    from vllm.inputs import mm_input
    from vllm.multimodal.inputs import (
        MultiModalFieldConfig,
        MultiModalKwargsItems,
        PlaceholderRange,
    )

    if leg.input_ids is None:
        raise _fail("a metadata leg needs the prefill-expanded input_ids", "input_ids")
    if len(grids) != len(leg.batches):
        raise _fail(f"{len(grids)} sets of grid values for {len(leg.batches)} batches", "grids")
    data: dict[str, Any] = {}
    fields: dict[str, Any] = {}
    hashes: dict[str, list[str]] = {}
    placeholders: dict[str, list[Any]] = {}
    for i, (batch, values) in enumerate(zip(leg.batches, grids, strict=True)):
        modality = batch.modality.value
        items = len(batch.mm_hashes)
        sizes_of = dict(batch.flat_keys)
        unknown = set(values) - set(batch.tensor_names)
        if unknown:
            raise _fail(f"batch {i} has no tensor {sorted(unknown)[0]!r}", f"grids[{i}]")
        for name in batch.tensor_names:
            if name not in MROPE_GRID_KEYS:
                continue  # a sizes tensor: it shapes its grid's field below
            if name not in values:
                raise _fail(f"batch {i} needs the values of its {name}", f"grids[{i}].{name}")
            if name in data:
                raise _fail(f"two batches name the tensor {name}", f"grids[{i}].{name}")
            value = torch.as_tensor(values[name])
            if name in sizes_of:
                sizes_name = sizes_of[name]
                if sizes_name not in values:
                    raise _fail(f"batch {i} needs its {sizes_name}", f"grids[{i}].{sizes_name}")
                sizes = torch.as_tensor(values[sizes_name]).flatten().to(torch.int64)
                fields[name] = MultiModalFieldConfig.flat_from_sizes(
                    modality, sizes, keep_on_cpu=True
                )
            else:
                expected = (items, 3) if name in _THW else (items,)
                if tuple(value.shape) != expected:
                    raise _fail(
                        f"batch {i}'s {name} has shape {tuple(value.shape)}, not {expected}",
                        f"grids[{i}].{name}",
                    )
                fields[name] = MultiModalFieldConfig.batched(modality, keep_on_cpu=True)
            data[name] = value
        hashes.setdefault(modality, []).extend(batch.mm_hashes)
        placeholders.setdefault(modality, []).extend(
            PlaceholderRange(offset=p.offset, length=p.length) for p in batch.placeholders
        )
    items = MultiModalKwargsItems.from_hf_inputs(BatchFeature(data, tensor_type="pt"), fields)
    engine_input: dict[str, Any] = mm_input(
        prompt_token_ids=list(leg.input_ids),
        mm_kwargs=items,
        mm_hashes=hashes,
        mm_placeholders=placeholders,
        cache_salt=decode_cache_salt(leg),
    )
    return engine_input

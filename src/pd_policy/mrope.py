"""M-RoPE grids: the tensors a leg needs to derive multimodal rotary positions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .batch import MultimodalBatch
from .errors import MropeOnLanguageModelOnlyDecode
from .request import Request

__all__ = ["MROPE_GRID_KEYS", "grids_kept_on_cpu", "has_mrope_grids", "mrope_metadata_gap"]

#: Model-specific tensor names that carry M-RoPE geometry (Qwen-VL family and peers).
MROPE_GRID_KEYS: Final = frozenset(
    {"image_grid_thw", "video_grid_thw", "second_per_grid_ts", "video_second_per_grid"}
)


def has_mrope_grids(request: Request) -> bool:
    """True when any batch, primary or extra, has an M-RoPE grid tensor.

    Only the key counts: a grid without a payload still marks a model whose
    decode positions depend on the image geometry.
    """
    return any(t.name in MROPE_GRID_KEYS for b in request.batches for t in b.tensors)


def grids_kept_on_cpu(batch: MultimodalBatch, kept: Iterable[str]) -> tuple[str, ...]:
    """``keep_on_cpu_keys`` for a leg that keeps the tensors ``kept`` of ``batch``.

    The batch's own keys that the leg keeps, in order, then every kept M-RoPE
    grid the batch did not list, sorted. Beyond upstream: vLLM 0.32 strips an
    item down to its keep-on-CPU fields once its tokens are prefix-cached or
    loaded from a KV connector, so a grid left off this list is lost and the
    engine dies with ``KeyError: 'image_grid_thw'`` on the next request with
    the same image (prefill and decode legs alike).
    """
    names = set(kept)
    listed = tuple(k for k in batch.keep_on_cpu_keys if k in names)
    return listed + tuple(sorted(g for g in names & MROPE_GRID_KEYS if g not in listed))


def _gap(detail: str, param: str) -> MropeOnLanguageModelOnlyDecode:
    return MropeOnLanguageModelOnlyDecode(
        "the selected decode worker runs with --language-model-only and takes an M-RoPE "
        f"image's metadata instead of its pixels, but {detail}",
        param=param,
    )


def mrope_metadata_gap(request: Request) -> MropeOnLanguageModelOnlyDecode | None:
    """What an M-RoPE request lacks for a worker that takes multimodal metadata, or ``None``.

    Such a worker gets, per item, the content hash, the placeholder range and
    the grid, and computes the image's rotary positions from them; its KV
    comes from prefill, so it never encodes the image. It needs, in order:

    1. tokenized input: the prefill-expanded ids its placeholders index;
    2. per batch, a content hash per item: without them vLLM hashes the grid
       alone, and two images with one grid share prefix-cache blocks;
    3. an M-RoPE grid in every batch, with its payload inline (a shared-memory
       or remote handle cannot serve a second leg), and so the sizes tensor of a
       flattened grid;
    4. one placeholder range per item.

    The answer is the typed refusal naming the first gap (a 400 whose ``param``
    is the field), for the decision to raise.
    """
    if request.input_ids is None:
        return _gap("the request has no tokenized input_ids to place the images in", "input_ids")
    for i, batch in enumerate(request.batches):
        where = f"batches[{i}]"
        if not batch.mm_hashes:
            return _gap(
                f"batch {i} has no content hashes: without them two images with one grid "
                "would share prefix-cache blocks",
                f"{where}.mm_hashes",
            )
        grids = [t for t in batch.tensors if t.name in MROPE_GRID_KEYS]
        if not grids:
            return _gap(f"batch {i} carries no M-RoPE grid", f"{where}.tensors")
        sizes = dict(batch.flat_keys)
        for grid in grids:
            size = batch.tensor(sizes[grid.name]) if grid.name in sizes else None
            if not grid.is_inline or (grid.name in sizes and (size is None or not size.is_inline)):
                return _gap(
                    f"the {grid.name} of batch {i} (or its sizes tensor) is not inline, and a "
                    "second leg cannot read a shared-memory or remote payload",
                    f"{where}.tensors.{grid.name}",
                )
        if len(batch.placeholders) != len(batch.mm_hashes):
            return _gap(
                f"batch {i} has {len(batch.placeholders)} placeholder ranges for "
                f"{len(batch.mm_hashes)} items",
                f"{where}.placeholders",
            )
    return None

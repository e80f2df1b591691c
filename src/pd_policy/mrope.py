"""M-RoPE grids: the tensors a leg needs to derive multimodal rotary positions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .batch import MultimodalBatch
from .request import Request

__all__ = ["MROPE_GRID_KEYS", "grids_kept_on_cpu", "has_mrope_grids"]

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

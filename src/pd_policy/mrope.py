"""M-RoPE grids: the tensors a decode leg needs to derive multimodal rotary positions."""

from __future__ import annotations

from typing import Final

from .request import Request

__all__ = ["MROPE_GRID_KEYS", "has_mrope_grids"]

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

"""Router-side media processing for the in-process driver: what a router knows of an image
request before prefill.

A router that processes media itself (SMG's ``--mm-processing=router``) runs
the model's own Hugging Face processor: it expands the prompt's image
placeholders into the ids the engine will see, computes the pixel tensors and,
for an M-RoPE model, the grid, and hashes each image. The policy then decides
on that request, before any engine call. vLLM's processor is the same one, so
the prefill engine expands the prompt to exactly these ids (the driver checks).
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from pd_policy import (
    MROPE_GRID_KEYS,
    Modality,
    MultimodalBatch,
    PlaceholderRange,
    TensorDescriptor,
)

if TYPE_CHECKING:
    from PIL.Image import Image

__all__ = ["Preprocessed", "image_content_hash", "image_token_id", "preprocess"]


def image_content_hash(image: Image) -> str:
    """A content hash of an image: its mode, size and pixels (what the router hashes)."""
    digest = hashlib.sha256(f"{image.mode}:{image.width}x{image.height}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


def image_token_id(hf_config: object) -> int | None:
    """The id one image's placeholder run repeats (Qwen-VL's ``image_token_id``, LLaVA's
    ``image_token_index``), or ``None`` for a text model."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(hf_config, name, None)
        if isinstance(value, int):
            return value
    return None


@attrs.frozen
class Preprocessed:
    """An image request as the router sees it: expanded ids, one batch of descriptors, and
    the values of the batch's M-RoPE grids (which a metadata decode leg carries)."""

    input_ids: tuple[int, ...]
    batch: MultimodalBatch
    grid_values: dict[str, Any]


@functools.cache
def _processor(model: str) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model)


def _runs(ids: Sequence[int], token: int) -> list[PlaceholderRange]:
    runs: list[list[int]] = []
    for i, t in enumerate(ids):
        if t == token:
            if runs and runs[-1][0] + runs[-1][1] == i:
                runs[-1][1] += 1
            else:
                runs.append([i, 1])
    return [PlaceholderRange(offset, length) for offset, length in runs]


def _descriptor(name: str, tensor: Any) -> TensorDescriptor:
    shape = tuple(int(d) for d in tensor.shape)
    nbytes = math.prod(shape) * tensor.element_size()
    return TensorDescriptor(name, shape, str(tensor.dtype).removeprefix("torch."), nbytes=nbytes)


def preprocess(model: str, token: int, prompt: str, images: Sequence[Image]) -> Preprocessed:
    """Process ``prompt`` and ``images`` with ``model``'s own processor, as a router does.

    ``token`` is the model's image placeholder id
    ([`image_token_id`][pd_policy_vllm.preprocess.image_token_id]).
    Raises ``ValueError`` when the expanded prompt does not hold one
    placeholder run per image.
    """
    out = _processor(model)(text=[prompt], images=list(images), return_tensors="pt")
    ids = tuple(int(t) for t in out["input_ids"][0])
    placeholders = _runs(ids, token)
    if len(placeholders) != len(images):
        raise ValueError(f"{len(placeholders)} placeholder runs for {len(images)} images")
    grids = {name: out[name] for name in out if name in MROPE_GRID_KEYS}
    batch = MultimodalBatch(
        modality=Modality.IMAGE,
        pixel_values=_descriptor("pixel_values", out["pixel_values"]),
        tensors=[_descriptor(name, value) for name, value in grids.items()],
        placeholders=placeholders,
        mm_hashes=tuple(image_content_hash(i) for i in images),
        im_token_id=token,
        keep_on_cpu_keys=tuple(sorted(grids)),
    )
    return Preprocessed(ids, batch, grids)

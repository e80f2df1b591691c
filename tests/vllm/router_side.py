"""``GenerateRequest`` messages as SMG's router builds them with router-side media processing.

The model's own Hugging Face processor expands the prompt's image
placeholders and computes the pixel tensors (and, for Qwen2-VL, the M-RoPE
grid); the request then carries them inline with the per-image content hash,
the placeholder ranges and the field layout, exactly as the servicer reads
them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from pd_policy_grpc.wire import common, pb
from pd_policy_vllm.local_pd import image_content_hash

__all__ = ["frames", "image", "router_request", "router_video_request", "tensor_data"]


def image(seed: int, side: int = 84) -> Image.Image:
    """A square RGB image; different seeds give different pixels."""
    pixels = np.random.default_rng(seed).integers(0, 255, (side, side, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@functools.cache
def _processor(model_dir: str) -> Any:
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


def tensor_data(tensor: Any) -> pb.TensorData:
    """A torch tensor as an inline wire tensor (little-endian bytes, dtype by name)."""
    array = tensor.contiguous().numpy()
    return pb.TensorData(shape=list(array.shape), dtype=str(array.dtype), inline=array.tobytes())


def _runs(ids: Sequence[int], token: int) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(ids):
        if t != token:
            continue
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


def router_request(
    model_dir: str,
    prompt: str,
    images: Sequence[Image.Image] = (),
    *,
    image_token_id: int | None = None,
    request_id: str = "req",
    max_tokens: int = 8,
    n: int = 1,
    keep_grids_on_cpu: bool = True,
    logprobs: int | None = None,
    stream: bool = True,
) -> pb.GenerateRequest:
    """The tokenized request for ``prompt`` and ``images``, greedy, ``max_tokens`` long.

    ``keep_grids_on_cpu=False`` leaves ``image_grid_thw`` out of
    ``keep_on_cpu_keys``, as a careless router would. ``logprobs=0`` asks for
    each sampled token's log-probability.
    """
    processor = _processor(model_dir)
    if images:
        out = processor(text=[prompt], images=list(images), return_tensors="pt")
    else:
        out = processor.tokenizer([prompt], return_tensors="pt")
    ids = [int(t) for t in out["input_ids"][0]]
    request = pb.GenerateRequest(
        request_id=request_id, tokenized=pb.TokenizedInput(input_ids=ids), stream=stream
    )
    request.tokenized.original_text = prompt
    params = request.sampling_params
    params.temperature = 0.0
    params.max_tokens = max_tokens
    params.n = n
    if logprobs is not None:
        params.logprobs = logprobs
    if not images:
        return request
    assert image_token_id is not None, "an image request needs the model's image token id"
    batch = request.mm_inputs
    batch.modality = common.IMAGE
    batch.im_token_id = image_token_id
    batch.mm_hashes.extend(image_content_hash(i) for i in images)
    for offset, length in _runs(ids, image_token_id):
        batch.mm_placeholders.add(offset=offset, length=length)
    batch.pixel_values.CopyFrom(tensor_data(out["pixel_values"]))
    if "image_grid_thw" in out:
        # Qwen2-VL: pixels are flat patches, split per image by the grid's products.
        grid = out["image_grid_thw"]
        batch.model_specific_tensors["image_grid_thw"].CopyFrom(tensor_data(grid))
        batch.model_specific_tensors["image_grid_sizes"].CopyFrom(tensor_data(grid.prod(-1)))
        batch.flat_keys["pixel_values"] = "image_grid_sizes"
        batch.batched_keys.append("image_grid_thw")
        if keep_grids_on_cpu:
            batch.keep_on_cpu_keys.append("image_grid_thw")
    else:
        batch.batched_keys.append("pixel_values")
    return request


def frames(seed: int, count: int = 4, side: int = 56) -> Any:
    """A clip's frames, decoded, as a router holds them: ``count`` random RGB frames."""
    return np.random.default_rng(seed).integers(0, 256, (count, side, side, 3), dtype=np.uint8)


def router_video_request(
    model_dir: str, prompt: str, clip: Any, *, request_id: str = "req", max_tokens: int = 8
) -> pb.GenerateRequest:
    """The tokenized request for ``prompt`` (one ``<|video_pad|>``) and one clip's frames,
    processed as SMG's router does for Qwen2-VL: flat patches split by the video grid, the
    grid batched and kept on CPU, a content hash of the frames. Greedy, with logprobs."""
    processor = _processor(model_dir)
    out = processor(text=[prompt], videos=[clip], return_tensors="pt")
    ids = [int(t) for t in out["input_ids"][0]]
    video_token = int(processor.tokenizer.convert_tokens_to_ids("<|video_pad|>"))
    request = pb.GenerateRequest(
        request_id=request_id, tokenized=pb.TokenizedInput(input_ids=ids), stream=True
    )
    request.tokenized.original_text = prompt
    request.sampling_params.temperature = 0.0
    request.sampling_params.max_tokens = max_tokens
    request.sampling_params.logprobs = 0
    batch = request.mm_inputs
    batch.modality = common.VIDEO
    batch.im_token_id = video_token
    digest = hashlib.sha256(f"{clip.shape}:".encode() + clip.tobytes()).hexdigest()
    batch.mm_hashes.append(digest)
    for offset, length in _runs(ids, video_token):
        batch.mm_placeholders.add(offset=offset, length=length)
    batch.pixel_values.CopyFrom(tensor_data(out["pixel_values_videos"]))
    grid = out["video_grid_thw"]
    batch.model_specific_tensors["video_grid_thw"].CopyFrom(tensor_data(grid))
    batch.model_specific_tensors["video_grid_sizes"].CopyFrom(tensor_data(grid.prod(-1)))
    batch.flat_keys["pixel_values"] = "video_grid_sizes"
    batch.batched_keys.append("video_grid_thw")
    batch.keep_on_cpu_keys.append("video_grid_thw")
    return request

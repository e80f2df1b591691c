"""Core requests shaped like a router's for the tiny LLaVA: a prompt whose image placeholder
run is already expanded, the image's pixels (as a descriptor) and its content hash.

Different images of the same size expand to the same ids, so two requests that differ
only in their image differ only in their hash: exactly the case the salt fold is for.
"""

from __future__ import annotations

from typing import Final

from tiny_models import TinyModel

from pd_policy import (
    Modality,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
)
from pd_policy.tools.scenarios import content_hash

__all__ = ["PROMPT_LENGTH", "TEXT_BEFORE_IMAGE", "image_request", "text_request"]

#: Ids in a prompt: over three 32-token blocks, so a repeat can hit the prefix cache.
PROMPT_LENGTH: Final = 100
#: Text ids before the image's placeholder run.
TEXT_BEFORE_IMAGE: Final = 5
_SIDE: Final = 84


def _text_ids(count: int, stride: int, start: int) -> list[int]:
    # Ordinary BPE ids of the tiny vocabulary (20..319): no special or image token.
    return [20 + (start + i * stride) % 300 for i in range(count)]


def image_request(
    model: TinyModel, *, image: str, variant: int, cache_salt: str | None = None
) -> Request:
    """A prefill-expanded request with one image, as the router sends it to prefill.

    ``variant`` changes the text before the image, so each test can start from a prompt
    no earlier test has put in an engine's prefix cache; ``image`` names the image
    (its content hash); ``cache_salt`` is the caller's own salt.
    """
    assert model.image_token_id is not None and model.image_tokens > 0
    ids = _text_ids(TEXT_BEFORE_IMAGE, stride=7, start=variant * 31)
    ids += [model.image_token_id] * model.image_tokens
    ids += _text_ids(PROMPT_LENGTH - len(ids), stride=13, start=0)
    pixels = TensorDescriptor(
        "pixel_values",
        (1, 3, _SIDE, _SIDE),
        "float32",
        PayloadLocation.INLINE,
        3 * _SIDE * _SIDE * 4,
    )
    batch = MultimodalBatch(
        modality=Modality.IMAGE,
        pixel_values=pixels,
        placeholders=(PlaceholderRange(TEXT_BEFORE_IMAGE, model.image_tokens),),
        mm_hashes=(content_hash(image),),
        im_token_id=model.image_token_id,
        batched_keys=("pixel_values",),
    )
    return Request(f"req-{variant}-{image}", input_ids=ids, batches=(batch,), cache_salt=cache_salt)


def text_request(*, cache_salt: str | None = None) -> Request:
    """A short tokenized text request in the tiny vocabulary (no media)."""
    return Request("req-text", input_ids=_text_ids(16, stride=11, start=0), cache_salt=cache_salt)

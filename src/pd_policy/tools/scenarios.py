"""Bundled example requests and the scenarios ``pd-policy demo`` runs.

The requests are shaped like the ones in the upstream PR's tests: a prompt whose
image placeholder run the router already expanded, a pixel tensor that lives
inline, per-image content hashes, and KV parameters in NIXL's form.
"""

from __future__ import annotations

import hashlib
from typing import Final

import attrs

from pd_policy.batch import Modality, MultimodalBatch, PlaceholderRange
from pd_policy.request import MediaRef, Request
from pd_policy.tensor import PayloadLocation, TensorDescriptor
from pd_policy.worker import Support, WorkerCapability

from .outcome import PrefillResult

__all__ = [
    "IMAGE_TOKEN_ID",
    "SCENARIOS",
    "Scenario",
    "content_hash",
    "image_request",
    "media_ref_request",
    "mrope_request",
    "text_request",
]

#: The placeholder id the examples expand each image into.
IMAGE_TOKEN_ID: Final = 32000
_PROMPT_HEAD: Final = (1, 3148, 338, 445)
_PROMPT_TAIL: Final = (13, 22550, 29901)
#: What vLLM 0.32's NixlConnector returns from a prefill (every field, and its block ids as
#: one list per KV cache group: the shape of the vectors' ``fixtures.NIXL``).
_NIXL_PARAMS: Final = (
    '{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[[0,1]],'
    '"remote_engine_id":"prefill-0","remote_request_id":"chatcmpl-req-1",'
    '"remote_host":"prefill-0.local","remote_port":5600,"tp_size":1,"dcp_size":1,'
    '"pp_size":1,"remote_num_tokens":23,"remote_blocks_expiry_time":null,'
    '"transfer_mode":"pull","remote_prefill_cached_tokens":0}'
)


def content_hash(name: str) -> str:
    """A stand-in per-item content hash (64 hex digits, like blake3's)."""
    return hashlib.sha256(name.encode()).hexdigest()


def _expanded(tokens_per_image: int, images: int) -> tuple[tuple[int, ...], list[PlaceholderRange]]:
    ids = list(_PROMPT_HEAD)
    ranges = []
    for _ in range(images):
        ranges.append(PlaceholderRange(len(ids), tokens_per_image))
        ids += [IMAGE_TOKEN_ID] * tokens_per_image
    return tuple(ids + list(_PROMPT_TAIL)), ranges


def image_request(
    *,
    images: tuple[str, ...] = ("dog.jpg",),
    tokens_per_image: int = 16,
    n: int = 1,
    cache_salt: str | None = None,
    request_id: str = "req-1",
) -> Request:
    """A grid-less (LLaVA-style) image request with one batch of ``images``."""
    ids, ranges = _expanded(tokens_per_image, len(images))
    side = 336
    pixels = TensorDescriptor(
        "pixel_values",
        (len(images), 3, side, side),
        "float32",
        PayloadLocation.INLINE,
        len(images) * 3 * side * side * 4,
    )
    batch = MultimodalBatch(
        modality=Modality.IMAGE,
        pixel_values=pixels,
        placeholders=ranges,
        mm_hashes=tuple(content_hash(i) for i in images),
        im_token_id=IMAGE_TOKEN_ID,
        batched_keys=("pixel_values",),
    )
    return Request(request_id, input_ids=ids, batches=(batch,), n=n, cache_salt=cache_salt)


def mrope_request(
    *,
    n: int = 1,
    request_id: str = "req-1",
    grid_location: PayloadLocation = PayloadLocation.INLINE,
    hashes: bool = True,
) -> Request:
    """A Qwen2-VL-style image request: the batch carries an ``image_grid_thw`` grid.

    ``grid_location`` is where the grid's payload lives; ``hashes=False`` leaves
    the batch without content hashes.
    """
    base = image_request(n=n, request_id=request_id)
    nbytes = 0 if grid_location is PayloadLocation.NONE else 24
    grid = TensorDescriptor("image_grid_thw", (1, 3), "int64", grid_location, nbytes)
    batch = attrs.evolve(
        base.batches[0],
        tensors=(grid,),
        keep_on_cpu_keys=("image_grid_thw",),
        mm_hashes=base.batches[0].mm_hashes if hashes else (),
    )
    return base.derive(batches=(batch,))


def media_ref_request(*, n: int = 1, request_id: str = "req-1") -> Request:
    """A request whose image the router left as a reference (worker-side processing)."""
    ids = (*_PROMPT_HEAD, IMAGE_TOKEN_ID, *_PROMPT_TAIL)
    ref = MediaRef(Modality.IMAGE, "https://media.example/dog.jpg?token=secret")
    return Request(request_id, input_ids=ids, media_refs=(ref,), n=n)


def text_request(*, n: int = 1, request_id: str = "req-1") -> Request:
    """A plain tokenized text request."""
    return Request(request_id, input_ids=(*_PROMPT_HEAD, *_PROMPT_TAIL), n=n)


@attrs.frozen(slots=True)
class Scenario:
    """One demo row: a request, its decode worker, and what the prefill returned."""

    name: str
    request: Request
    decode_worker: WorkerCapability
    prefill: PrefillResult


_FULL_VISION: Final = WorkerCapability(Support.TRUE)
_LM_ONLY: Final = WorkerCapability(Support.FALSE)
_LM_ONLY_METADATA: Final = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
_HANDOFF: Final = PrefillResult.returned(_NIXL_PARAMS)

#: The scenarios ``pd-policy demo`` tabulates, in order.
SCENARIOS: Final[tuple[Scenario, ...]] = (
    Scenario("image on a full-vision decode worker", image_request(), _FULL_VISION, _HANDOFF),
    Scenario("grid-less image, language-model-only decode", image_request(), _LM_ONLY, _HANDOFF),
    Scenario("M-RoPE grids, language-model-only decode", mrope_request(), _LM_ONLY, _HANDOFF),
    Scenario(
        "M-RoPE grids, LM-only decode that takes metadata",
        mrope_request(),
        _LM_ONLY_METADATA,
        _HANDOFF,
    ),
    Scenario(
        "media references, language-model-only decode", media_ref_request(), _LM_ONLY, _HANDOFF
    ),
    Scenario(
        "n=2 with an image, language-model-only decode", image_request(n=2), _LM_ONLY, _HANDOFF
    ),
    Scenario("n=2 text, language-model-only decode", text_request(n=2), _LM_ONLY, _HANDOFF),
    Scenario(
        "image, prefill returned no KV parameters",
        image_request(),
        _LM_ONLY,
        PrefillResult.nothing(),
    ),
    Scenario(
        "text, prefill returned no KV parameters", text_request(), _LM_ONLY, PrefillResult.nothing()
    ),
)

"""The upstream PR's unit tests (contract section 8), restated against the core.

Built on the same request as upstream's ``vllm_pd_mm_request``: ids
``[1, 2, 151655, 151655, 3]``, pixels, an ``image_grid_thw`` grid, one
``img-hash``, an extra VIDEO batch with ``vid-hash``, KV JSON
``{"do_remote_prefill":true}`` and one media reference. (The core refuses media
references together with batches, so the reference-carrying variants are built
separately.)
"""

from __future__ import annotations

import pytest

from pd_policy import (
    DecodeForm,
    LegacyKvParams,
    MediaRef,
    MediaRefsOnLanguageModelOnlyDecode,
    Modality,
    MropeOnLanguageModelOnlyDecode,
    MultimodalBatch,
    NSamplesOnLanguageModelOnlyDecode,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
    VisionSupport,
    WorkerCapability,
    clone_without_mm,
    has_mrope_grids,
    sequential_pd_decode_form,
)

IDS = (1, 2, 151655, 151655, 3)
KV = '{"do_remote_prefill":true}'
PIXELS = TensorDescriptor("pixel_values", (4, 1176), "float32", PayloadLocation.INLINE, 18816)
GRID = TensorDescriptor("image_grid_thw", (1, 3), "int64", PayloadLocation.INLINE, 24)


def primary(**kw: object) -> MultimodalBatch:
    fields: dict[str, object] = {
        "modality": Modality.IMAGE,
        "pixel_values": PIXELS,
        "tensors": (GRID,),
        "placeholders": (PlaceholderRange(2, 2),),
        "mm_hashes": ("img-hash",),
        "im_token_id": 151655,
        "batched_keys": ("pixel_values",),
        "flat_keys": {"image_grid_thw": "image_grid_thw"},
        "keep_on_cpu_keys": ("image_grid_thw",),
    }
    fields.update(kw)
    return MultimodalBatch(**fields)  # type: ignore[arg-type]


VIDEO = MultimodalBatch(modality=Modality.VIDEO, mm_hashes=("vid-hash",))


def pd_mm_request(**kw: object) -> Request:
    fields: dict[str, object] = {
        "request_id": "req-1",
        "input_ids": IDS,
        "batches": (primary(), VIDEO),
        "kv_transfer_params": KV,
    }
    fields.update(kw)
    return Request(**fields)  # type: ignore[arg-type]


def refs_request(**kw: object) -> Request:
    ref = MediaRef(Modality.IMAGE, "https://example.com/dog.png")
    return pd_mm_request(batches=(), media_refs=(ref,), **kw)


LM_ONLY = WorkerCapability(VisionSupport.FALSE)
VISION = WorkerCapability(VisionSupport.TRUE)


def test_clone_without_mm_keeps_only_hashes_ids_and_kv_params() -> None:
    original = pd_mm_request()
    leg = clone_without_mm(original)

    # The prefill leg is untouched: frozen values, and equal to a fresh build.
    assert original == pd_mm_request()
    assert original.batches[0].pixel_values == PIXELS

    assert leg.input_ids == IDS
    assert leg.kv_transfer_params == KV
    assert leg.media_refs == ()
    first, extra = leg.batches
    assert first.mm_hashes == ("img-hash",)
    assert first.pixel_values is None
    assert first.tensors == ()
    assert first.placeholders == ()
    assert first.im_token_id is None
    assert first.batched_keys == ()
    assert first.flat_keys == ()
    assert first.keep_on_cpu_keys == ()
    assert first.encoder_input_key is None
    assert extra == MultimodalBatch(modality=Modality.VIDEO, mm_hashes=("vid-hash",))


def test_clone_without_mm_drops_media_refs_of_a_refs_request() -> None:
    leg = clone_without_mm(refs_request())
    assert leg.media_refs == ()
    assert leg.input_ids == IDS


def test_clone_without_mm_drops_hashless_batches_whole() -> None:
    pixels_only = primary(mm_hashes=(), placeholders=())
    leg = clone_without_mm(pd_mm_request(batches=(pixels_only,)))
    assert leg.batches == ()
    # A hash-less primary goes, a hashed extra stays.
    leg = clone_without_mm(pd_mm_request(batches=(pixels_only, VIDEO)))
    assert leg.batches == (VIDEO,)


def test_has_mrope_grids_reads_every_batch() -> None:
    hashes_only = MultimodalBatch(mm_hashes=("img-hash",))
    assert not has_mrope_grids(pd_mm_request(batches=(hashes_only,)))
    video_grid = TensorDescriptor("video_grid_thw", (1, 3), "int64", PayloadLocation.NONE)
    cleared_primary = primary(tensors=(), flat_keys={}, keep_on_cpu_keys=())
    extra = MultimodalBatch(modality=Modality.VIDEO, tensors=(video_grid,), mm_hashes=("v",))
    assert has_mrope_grids(pd_mm_request(batches=(cleared_primary, extra)))
    assert not has_mrope_grids(Request("empty", input_ids=()))


@pytest.mark.parametrize(
    ("worker", "n", "expected"),
    [
        (VISION, 1, DecodeForm.IDENTITY_ONLY),  # (language_model_only=false, relay=true)
        (VISION, 2, DecodeForm.FULL),  # (false, false)
        (WorkerCapability(), 1, DecodeForm.IDENTITY_ONLY),  # no label: vision-capable
        (WorkerCapability(), 4, DecodeForm.FULL),
    ],
)
def test_sequential_pd_decode_form_keeps_todays_forms_for_vision_workers(
    worker: WorkerCapability, n: int, expected: DecodeForm
) -> None:
    assert sequential_pd_decode_form(pd_mm_request(n=n), worker) is expected


def test_sequential_pd_decode_form_picks_text_plus_hashes_for_language_model_only() -> None:
    gridless = pd_mm_request(batches=(primary(tensors=(), flat_keys={}, keep_on_cpu_keys=()),))
    assert sequential_pd_decode_form(gridless, LM_ONLY) is DecodeForm.TEXT_PLUS_HASHES
    text = Request("t", input_ids=(1, 2, 3))
    # Text requests take the stripped form whether the handoff relays or not.
    assert sequential_pd_decode_form(text, LM_ONLY) is DecodeForm.TEXT_PLUS_HASHES
    assert sequential_pd_decode_form(text.derive(n=3), LM_ONLY) is DecodeForm.TEXT_PLUS_HASHES


def test_has_kv_transfer_params_reads_both_wire_forms() -> None:
    assert Request("a", input_ids=(), kv_transfer_params=KV).has_kv_transfer_params
    legacy = LegacyKvParams("prefill-0", 7000)
    assert Request("b", input_ids=(), kv_legacy=legacy).has_kv_transfer_params
    # A request with neither (SGLang/TokenSpeed bootstrap info is not a vLLM KV handoff).
    assert not Request("c", input_ids=()).has_kv_transfer_params


def test_sequential_pd_decode_form_rejects_incompatible_pairings() -> None:
    with pytest.raises(MropeOnLanguageModelOnlyDecode) as grid:
        sequential_pd_decode_form(pd_mm_request(), LM_ONLY)
    assert grid.value.status == 400
    assert not grid.value.retryable
    with pytest.raises(MediaRefsOnLanguageModelOnlyDecode):
        sequential_pd_decode_form(refs_request(), LM_ONLY)
    gridless = pd_mm_request(batches=(primary(tensors=(), flat_keys={}, keep_on_cpu_keys=()),), n=2)
    with pytest.raises(NSamplesOnLanguageModelOnlyDecode) as samples:
        sequential_pd_decode_form(gridless, LM_ONLY)
    assert "language-model-only" in samples.value.message

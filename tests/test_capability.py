"""The honest ``supports_vision`` rule over engine facts (the servicer tests of section 8)."""

from __future__ import annotations

import pytest

from pd_policy import (
    EngineFacts,
    MalformedRequest,
    MediaProcessorAdvert,
    MmInputProbe,
    VisionSupport,
    advertise_media_processor,
    derive_supports_vision,
)

P = MmInputProbe
QWEN_LIMITS = {"image": 999, "video": 999}


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        # full-vision worker: the property answers true
        (EngineFacts(True, P.SUPPORTED, modality_limits=QWEN_LIMITS), True),
        # --language-model-only: the property answers false
        (EngineFacts(True, P.UNSUPPORTED, language_model_only=True), False),
        # text model: never probed
        (EngineFacts(False, P.SUPPORTED), False),
        (EngineFacts(False, P.UNAVAILABLE), False),
        # embeds-only: all supported modalities at 0 with enable_mm_embeds (property true)
        (EngineFacts(True, P.SUPPORTED, True, modality_limits={"image": 0, "video": 0}), False),
        # language_model_only + embeds (the KV-consumer switch of vLLM 0.30-0.32)
        (EngineFacts(True, P.SUPPORTED, True, True, {"image": 0, "video": 0}), False),
        # image at 0 but video allowed: an encoder still runs
        (EngineFacts(True, P.SUPPORTED, modality_limits={"image": 0, "video": 999}), True),
        # The reviewer's point: an explicit image=0 on an image+video model with embeds on
        # left video at its default; the model's supported set says so.
        (EngineFacts(True, P.SUPPORTED, True, modality_limits={"image": 0, "video": 999}), True),
        # registry fallback (vLLM <= 0.30): probe true / false
        (EngineFacts(True, P.SUPPORTED), True),
        (EngineFacts(True, P.UNSUPPORTED), False),
        # registry fallback under --language-model-only
        (EngineFacts(True, P.SUPPORTED, language_model_only=True), False),
        # registry without a processor: ValueError
        (EngineFacts(True, P.NO_PROCESSOR), False),
        # registry failure keeps the architecture's answer
        (EngineFacts(True, P.FAILED), True),
        # without vLLM: the architecture's answer
        (EngineFacts(True, P.UNAVAILABLE), True),
        (EngineFacts(True, P.UNAVAILABLE, language_model_only=True), False),
        # all at 0 without embeds: vLLM already says false
        (EngineFacts(True, P.UNSUPPORTED, modality_limits={"image": 0, "video": 0}), False),
    ],
)
def test_supports_vision(facts: EngineFacts, expected: bool) -> None:
    assert derive_supports_vision(facts) is expected


def test_facts_are_validated() -> None:
    with pytest.raises(MalformedRequest):
        EngineFacts(True, P.SUPPORTED, modality_limits={"image": -1})
    with pytest.raises(MalformedRequest):
        EngineFacts(True, P.SUPPORTED, modality_limits={"image": True})
    assert EngineFacts(True, P.SUPPORTED, modality_limits={"video": 1, "image": 2}) == EngineFacts(
        True, P.SUPPORTED, modality_limits=[("image", 2), ("video", 1)]
    )


def test_a_media_processor_is_advertised_only_by_a_vision_worker_whose_probe_passed() -> None:
    advert = advertise_media_processor(
        configured_processor="inprocess",
        schemes=("https", "data"),
        source="mm-processor-v2",
        supports_vision=True,
        probe_succeeded=True,
    )
    assert advert == MediaProcessorAdvert("inprocess", ("https", "data"), "mm-processor-v2")
    cases: list[tuple[bool | VisionSupport, bool, str]] = [
        (False, True, "inprocess"),
        (VisionSupport.FALSE, True, "redis"),
        (True, False, "inprocess"),
        (True, True, ""),
    ]
    for vision, probe, processor in cases:
        assert (
            advertise_media_processor(
                configured_processor=processor,
                schemes=("https",),
                source="s",
                supports_vision=vision,
                probe_succeeded=probe,
            )
            == MediaProcessorAdvert()
        )

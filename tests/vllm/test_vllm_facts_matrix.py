"""The capability probe across vLLM versions, on stand-in configs shaped like each version."""

from __future__ import annotations

import logging

import attrs
import pytest
from stand_ins import (
    DEFAULT_LIMIT,
    ModelConfigV030,
    ModelConfigV031,
    MultiModalConfigStandIn,
    RegistryPre019,
    RegistryV030,
    RegistryV031,
    install_registry,
    wrap,
)

from pd_policy import EngineFacts, MediaProcessorAdvert, MmInputProbe
from pd_policy_vllm import engine_facts, media_processor_advert, model_config_of, supports_vision

MM = MultiModalConfigStandIn


@attrs.frozen
class Case:
    """One vLLM shape and what the adapter must read from it."""

    model_config: object
    registry: object | None
    probe: MmInputProbe
    limits: dict[str, int] | None
    supports_vision: bool


_BOTH_ALLOWED = {"image": DEFAULT_LIMIT, "video": DEFAULT_LIMIT}
_BOTH_ZERO = {"image": 0, "video": 0}

CASES = {
    "0.31+ full vision": Case(
        ModelConfigV031(MM()), RegistryV031(), MmInputProbe.SUPPORTED, _BOTH_ALLOWED, True
    ),
    "0.31+ language_model_only": Case(
        ModelConfigV031(MM(language_model_only=True)),
        RegistryV031(),
        MmInputProbe.UNSUPPORTED,
        _BOTH_ZERO,
        False,
    ),
    "0.31+ every supported modality at 0": Case(
        ModelConfigV031(MM(limits=_BOTH_ZERO)),
        RegistryV031(),
        MmInputProbe.UNSUPPORTED,
        _BOTH_ZERO,
        False,
    ),
    "0.31+ image 0, video left at its default": Case(
        ModelConfigV031(MM(limits={"image": 0})),
        RegistryV031(),
        MmInputProbe.SUPPORTED,
        {"image": 0, "video": DEFAULT_LIMIT},
        True,
    ),
    # vLLM answers true (embeds are accepted), but there is no encoder for pixels.
    "0.31+ embeds-only": Case(
        ModelConfigV031(MM(enable_mm_embeds=True, limits=_BOTH_ZERO)),
        RegistryV031(),
        MmInputProbe.SUPPORTED,
        _BOTH_ZERO,
        False,
    ),
    # Upstream's first rule read only the explicit keys ({"image": 0}) and called this
    # embeds-only; video keeps its default limit, so the encoder is live.
    "0.31+ embeds with image 0, video left out": Case(
        ModelConfigV031(MM(enable_mm_embeds=True, limits={"image": 0})),
        RegistryV031(),
        MmInputProbe.SUPPORTED,
        {"image": 0, "video": DEFAULT_LIMIT},
        True,
    ),
    # vLLM 0.30-0.32 switch enable_mm_embeds on for KV consumers, even language-model-only.
    "0.31+ KV consumer, language_model_only": Case(
        ModelConfigV031(MM(language_model_only=True, enable_mm_embeds=True)),
        RegistryV031(),
        MmInputProbe.SUPPORTED,
        _BOTH_ZERO,
        False,
    ),
    "0.31+ property raises": Case(
        ModelConfigV031(MM(), failure=RuntimeError("boom")),
        RegistryV031(),
        MmInputProbe.FAILED,
        _BOTH_ALLOWED,
        True,
    ),
    "0.30 registry answers true": Case(
        ModelConfigV030(MM()),
        RegistryV030(answer=True),
        MmInputProbe.SUPPORTED,
        _BOTH_ALLOWED,
        True,
    ),
    "0.30 registry answers false": Case(
        ModelConfigV030(MM(limits=_BOTH_ZERO)),
        RegistryV030(answer=False),
        MmInputProbe.UNSUPPORTED,
        _BOTH_ZERO,
        False,
    ),
    "0.30 registry ValueError (no processor)": Case(
        ModelConfigV030(MM()),
        # Without a registered processor there is no processing info either.
        RegistryV030(answer=ValueError("no processor"), info_failure=ValueError("no processor")),
        MmInputProbe.NO_PROCESSOR,
        None,
        False,
    ),
    # The architecture's answer stands: a probe bug must not blind a healthy worker.
    "0.30 registry RuntimeError": Case(
        ModelConfigV030(MM()),
        RegistryV030(answer=RuntimeError("boom")),
        MmInputProbe.FAILED,
        _BOTH_ALLOWED,
        True,
    ),
    "0.30 KV consumer, language_model_only": Case(
        ModelConfigV030(MM(language_model_only=True, enable_mm_embeds=True)),
        RegistryV030(answer=True),
        MmInputProbe.SUPPORTED,
        _BOTH_ZERO,
        False,
    ),
    "0.30 embeds-only": Case(
        ModelConfigV030(MM(enable_mm_embeds=True, limits=_BOTH_ZERO)),
        RegistryV030(answer=True),
        MmInputProbe.SUPPORTED,
        _BOTH_ZERO,
        False,
    ),
    "registry older than get_processing_info": Case(
        ModelConfigV031(MM(limits={"video": 0}), supported=("image", "video")),
        RegistryPre019(),
        MmInputProbe.SUPPORTED,
        {"image": DEFAULT_LIMIT, "video": 0},
        True,
    ),
    # Only the architecture is known; the limits cannot be read.
    "no vLLM importable": Case(ModelConfigV030(MM()), None, MmInputProbe.UNAVAILABLE, None, True),
    "processing info fails": Case(
        ModelConfigV031(MM()),
        RegistryV031(info_failure=RuntimeError("tokenizer")),
        MmInputProbe.SUPPORTED,
        None,
        True,
    ),
    "text-only architecture": Case(
        ModelConfigV031(None), RegistryV030(), MmInputProbe.UNSUPPORTED, None, False
    ),
    "text-only architecture, 0.30": Case(
        ModelConfigV030(None), RegistryV030(), MmInputProbe.UNSUPPORTED, None, False
    ),
}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Case:
    chosen = CASES[request.param]
    install_registry(monkeypatch, chosen.registry)
    return chosen


def test_engine_facts_per_version(case: Case) -> None:
    mm = getattr(case.model_config, "multimodal_config", None)
    facts = engine_facts(case.model_config)
    assert facts == EngineFacts(
        is_multimodal_model=mm is not None,
        mm_input_probe=case.probe,
        enable_mm_embeds=False if mm is None else mm.enable_mm_embeds,
        language_model_only=False if mm is None else mm.language_model_only,
        modality_limits=case.limits,
    )


def test_supports_vision_per_version(case: Case) -> None:
    assert supports_vision(case.model_config) is case.supports_vision


@pytest.mark.parametrize("shape", ["ModelConfig", "VllmConfig", "AsyncLLM", "LLM"])
def test_every_source_shape_reaches_the_model_config(case: Case, shape: str) -> None:
    source = wrap(case.model_config, shape)
    assert model_config_of(source) is case.model_config
    assert engine_facts(source) == engine_facts(case.model_config)


def test_a_text_only_architecture_is_not_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = RegistryV030(answer=ValueError("no processor"))
    install_registry(monkeypatch, registry)
    assert engine_facts(ModelConfigV030(None)).mm_input_probe is MmInputProbe.UNSUPPORTED
    assert registry.probed == 0


def test_the_registry_is_asked_only_without_the_property(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = RegistryV030(answer=False)
    install_registry(monkeypatch, registry)
    assert engine_facts(ModelConfigV031(MM())).mm_input_probe is MmInputProbe.SUPPORTED
    assert registry.probed == 0
    assert engine_facts(ModelConfigV030(MM())).mm_input_probe is MmInputProbe.UNSUPPORTED
    assert registry.probed == 1


@pytest.mark.parametrize(
    ("model_config", "registry"),
    [
        (ModelConfigV030(MM()), RegistryV030(answer=RuntimeError("boom"))),
        (ModelConfigV031(MM(), failure=RuntimeError("boom")), RegistryV031()),
    ],
    ids=["registry", "property"],
)
def test_a_failed_probe_is_logged(
    model_config: object,
    registry: object,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    install_registry(monkeypatch, registry)
    with caplog.at_level(logging.WARNING, logger="pd_policy_vllm"):
        assert engine_facts(model_config).mm_input_probe is MmInputProbe.FAILED
    assert any("boom" in (r.exc_text or "") for r in caplog.records)


def test_an_unknown_source_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="expected a vLLM LLM, AsyncLLM, VllmConfig or ModelConfig"):
        engine_facts(object())


def test_supports_vision_never_raises_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="pd_policy_vllm"):
        assert supports_vision(object()) is False
    assert "reporting supports_vision=false" in caplog.text


def test_limits_that_are_not_counts_are_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    install_registry(monkeypatch, RegistryV031())
    model_config = ModelConfigV031(MM(limits={"image": -1}))
    assert engine_facts(model_config).modality_limits is None


@pytest.mark.parametrize(
    ("source", "advert"),
    [
        (
            wrap(ModelConfigV031(MM()), "LLM"),
            MediaProcessorAdvert("inprocess", ("https", "data"), "worker"),
        ),
        (wrap(ModelConfigV031(MM(language_model_only=True)), "LLM"), MediaProcessorAdvert()),
        (
            wrap(ModelConfigV031(MM(enable_mm_embeds=True, limits=_BOTH_ZERO)), "AsyncLLM"),
            MediaProcessorAdvert(),
        ),
        (object(), MediaProcessorAdvert()),
    ],
    ids=["vision", "language-model-only", "embeds-only", "not-an-engine"],
)
def test_media_processor_advert_follows_supports_vision(
    source: object, advert: MediaProcessorAdvert, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_registry(monkeypatch, RegistryV031())
    got = media_processor_advert(
        source,
        configured_processor="inprocess",
        schemes=("https", "data"),
        source="worker",
        probe_succeeded=True,
    )
    assert got == advert


def test_media_processor_advert_needs_a_successful_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    install_registry(monkeypatch, RegistryV031())
    got = media_processor_advert(
        ModelConfigV031(MM()),
        configured_processor="inprocess",
        schemes=("https",),
        source="worker",
        probe_succeeded=False,
    )
    assert got == MediaProcessorAdvert()

"""The capability probe on real vLLM configs and live engines of tiny local models.

Each row also records vLLM's own ``supports_multimodal_inputs``, to show where the
honest answer differs from it (embeds-only, and a language-model-only KV consumer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from live_engines import engine_config
from tiny_models import TinyModel

from pd_policy import EngineFacts, MmInputProbe
from pd_policy_vllm import DecodeEngine, accepts_mm_metadata, engine_facts, supports_vision

_ALLOWED = 999


@attrs.frozen
class ConfigCase:
    model: str
    overrides: dict[str, Any]
    limits: dict[str, int] | None
    supports_vision: bool
    #: What vLLM's own check answers for the same config.
    vllm_supports_mm_inputs: bool


def _kv_consumer(store: Path) -> dict[str, Any]:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"shared_storage_path": str(store)},
    }


CONFIG_CASES = {
    "full vision": ConfigCase("qwen2vl", {}, {"image": _ALLOWED, "video": _ALLOWED}, True, True),
    "language_model_only": ConfigCase(
        "qwen2vl", {"language_model_only": True}, {"image": 0, "video": 0}, False, False
    ),
    "every supported modality at 0": ConfigCase(
        "qwen2vl",
        {"limit_mm_per_prompt": {"image": 0, "video": 0}},
        {"image": 0, "video": 0},
        False,
        False,
    ),
    "image 0, video allowed": ConfigCase(
        "qwen2vl",
        {"limit_mm_per_prompt": {"image": 0}},
        {"image": 0, "video": _ALLOWED},
        True,
        True,
    ),
    "all at 0 with enable_mm_embeds (embeds-only)": ConfigCase(
        "qwen2vl",
        {"limit_mm_per_prompt": {"image": 0, "video": 0}, "enable_mm_embeds": True},
        {"image": 0, "video": 0},
        False,
        True,
    ),
    # Only the explicit keys are 0 here; video keeps its default limit and the encoder.
    "image 0 with enable_mm_embeds, video left out": ConfigCase(
        "qwen2vl",
        {"limit_mm_per_prompt": {"image": 0}, "enable_mm_embeds": True},
        {"image": 0, "video": _ALLOWED},
        True,
        True,
    ),
    "grid-less model, its only modality at 0": ConfigCase(
        "llava", {"limit_mm_per_prompt": {"image": 0}}, {"image": 0}, False, False
    ),
    "text-only model": ConfigCase("llama", {}, None, False, False),
}


@pytest.mark.parametrize("name", sorted(CONFIG_CASES))
def test_probe_on_real_configs(name: str, tiny_models: dict[str, TinyModel]) -> None:
    case = CONFIG_CASES[name]
    config = engine_config(tiny_models[case.model], **case.overrides)
    facts = engine_facts(config)
    multimodal = case.model != "llama"
    assert facts.is_multimodal_model is multimodal
    assert facts.modality_limits == (
        None if case.limits is None else tuple(sorted(case.limits.items()))
    )
    assert facts.language_model_only is case.overrides.get("language_model_only", False)
    assert facts.enable_mm_embeds is case.overrides.get("enable_mm_embeds", False)
    assert config.model_config.supports_multimodal_inputs is case.vllm_supports_mm_inputs
    assert facts.mm_input_probe is (
        MmInputProbe.SUPPORTED if case.vllm_supports_mm_inputs else MmInputProbe.UNSUPPORTED
    )
    assert supports_vision(config) is case.supports_vision


def test_language_model_only_kv_consumer_is_not_vision(qwen2vl: TinyModel, kv_store: Path) -> None:
    """vLLM 0.30-0.32 switch ``enable_mm_embeds`` on for a KV consumer while building the
    ``VllmConfig``, so vLLM's own check says true: only the carve-out answers false. The
    same consumer takes multimodal metadata (``allow_missing_mm_embeddings``)."""
    config = engine_config(
        qwen2vl, language_model_only=True, kv_transfer_config=_kv_consumer(kv_store)
    )
    facts = engine_facts(config)
    assert config.model_config.supports_multimodal_inputs is True
    assert facts == EngineFacts(
        is_multimodal_model=True,
        mm_input_probe=MmInputProbe.SUPPORTED,
        enable_mm_embeds=True,
        language_model_only=True,
        modality_limits={"image": 0, "video": 0},
        is_kv_consumer=True,
        allow_missing_mm_embeddings=True,
    )
    assert supports_vision(config) is False
    assert accepts_mm_metadata(config) is True
    # A bare ModelConfig does not know the engine's KV role: it answers false.
    assert accepts_mm_metadata(config.model_config) is False


@pytest.mark.parametrize(
    ("engine", "expected"),
    [
        ("qwen2vl_engine", True),
        ("qwen2vl_lm_only_engine", False),
        ("llava_lm_only_engine", False),
        ("llama_engine", False),
    ],
)
def test_probe_on_live_engines(engine: str, expected: bool, request: pytest.FixtureRequest) -> None:
    llm = request.getfixturevalue(engine)
    facts = engine_facts(llm)
    # Every level a servicer may hold gives the same facts.
    assert engine_facts(llm.llm_engine) == facts
    assert engine_facts(llm.llm_engine.vllm_config) == facts
    assert engine_facts(llm.llm_engine.model_config) == facts
    assert supports_vision(llm) is expected
    assert DecodeEngine(llm).supports_vision is expected
    assert facts.language_model_only is (engine.endswith("lm_only_engine"))

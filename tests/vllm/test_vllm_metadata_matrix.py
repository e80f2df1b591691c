"""Whether a worker takes multimodal metadata, across vLLM versions, on stand-in configs.

What each version does to a KV consumer while building its ``VllmConfig``
(``vllm-and-peers.md`` A2): 0.28-0.29 set ``allow_missing_mm_embeddings`` but
need ``--enable-mm-embeds``; 0.30-0.32 set both, even under
``--language-model-only``; 0.33 keeps a language-model-only consumer text-only
unless the flag is given; 0.27 and earlier have no such field.
"""

from __future__ import annotations

import attrs
import pytest
from stand_ins import (
    KVTransferConfigStandIn,
    ModelConfigV031,
    MultiModalConfigStandIn,
    MultiModalConfigV027,
    RegistryV031,
    install_registry,
    wrap,
)

from pd_policy_vllm import accepts_mm_metadata, engine_facts, supports_vision

CONSUMER = KVTransferConfigStandIn("kv_consumer")


def lm_only(*, embeds: bool = False, allow: bool = False) -> MultiModalConfigStandIn:
    """A language-model-only config as a version's ``VllmConfig`` resolved it."""
    return MultiModalConfigStandIn(
        language_model_only=True, enable_mm_embeds=embeds, allow_missing_mm_embeddings=allow
    )


@attrs.frozen
class Case:
    multimodal_config: MultiModalConfigV027 | None
    kv: KVTransferConfigStandIn | None
    takes: bool


CASES = {
    "0.27 consumer, --enable-mm-embeds (no field)": Case(
        MultiModalConfigV027(language_model_only=True, enable_mm_embeds=True), CONSUMER, False
    ),
    "0.28-0.29 consumer without the flag": Case(
        lm_only(allow=True), CONSUMER, False
    ),
    "0.28-0.29 consumer with --enable-mm-embeds": Case(
        lm_only(embeds=True, allow=True),
        CONSUMER,
        True,
    ),
    "0.30-0.32 language-model-only consumer": Case(
        lm_only(embeds=True, allow=True),
        CONSUMER,
        True,
    ),
    "0.30-0.32 kv_both": Case(
        lm_only(embeds=True, allow=True),
        KVTransferConfigStandIn("kv_both"),
        True,
    ),
    "0.33 language-model-only consumer without the flag": Case(
        lm_only(allow=True), CONSUMER, False
    ),
    "a producer": Case(
        lm_only(), KVTransferConfigStandIn("kv_producer"), False
    ),
    "no connector": Case(lm_only(), None, False),
    "a consumer role without a connector": Case(
        lm_only(embeds=True, allow=True),
        KVTransferConfigStandIn("kv_consumer", kv_connector=None),
        False,
    ),
    "a text model": Case(None, CONSUMER, False),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("shape", ["LLM", "AsyncLLM", "VllmConfig"])
def test_accepts_mm_metadata_per_version(
    name: str, shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_registry(monkeypatch, RegistryV031())
    case = CASES[name]
    source = wrap(ModelConfigV031(case.multimodal_config), shape, case.kv)
    assert accepts_mm_metadata(source) is case.takes
    assert not supports_vision(source)  # every case lacks an encoder for pixels
    facts = engine_facts(source)
    assert facts.is_kv_consumer is (case.kv is not None and case.kv.is_kv_consumer)


def test_a_bare_model_config_cannot_tell(monkeypatch: pytest.MonkeyPatch) -> None:
    install_registry(monkeypatch, RegistryV031())
    case = CASES["0.30-0.32 language-model-only consumer"]
    assert not accepts_mm_metadata(wrap(ModelConfigV031(case.multimodal_config), "ModelConfig"))


def test_a_failure_answers_false(caplog: pytest.LogCaptureFixture) -> None:
    assert accepts_mm_metadata(object()) is False
    assert "reporting false" in caplog.text

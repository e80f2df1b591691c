"""Small stand-ins shaped like vLLM's configs, registries and engines, one shape per version.

They carry exactly the attributes the adapter reads, with vLLM's semantics:

- ``MultiModalConfigStandIn.get_limit_per_prompt``: 0 under ``language_model_only``,
  999 for a modality left out, else the explicit limit (vLLM 0.16+);
- ``ModelConfigV031`` has the ``supports_multimodal_inputs`` property (0.31+), with
  vLLM's rule: false when every supported modality has limit 0, unless
  ``enable_mm_embeds``; ``ModelConfigV030`` has no property (0.30 and earlier);
- ``RegistryV030`` has ``supports_multimodal_inputs(model_config)``,
  ``RegistryV031`` only ``get_processing_info``, ``RegistryPre019`` only
  ``_create_processing_info``;
- ``LLMStandIn`` / ``AsyncLLMStandIn`` / ``VllmConfigStandIn`` wrap a model config
  the way the real objects do.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Mapping

import attrs
import pytest

__all__ = [
    "DEFAULT_LIMIT",
    "AsyncLLMStandIn",
    "KVTransferConfigStandIn",
    "LLMEngineStandIn",
    "LLMStandIn",
    "ModelConfigV030",
    "ModelConfigV031",
    "MultiModalConfigStandIn",
    "MultiModalConfigV027",
    "ProcessingInfoStandIn",
    "RegistryPre019",
    "RegistryV030",
    "RegistryV031",
    "VllmConfigStandIn",
    "install_registry",
    "wrap",
]

#: vLLM's limit for a modality the operator left out.
DEFAULT_LIMIT = 999


@attrs.define
class MultiModalConfigV027:
    """A ``MultiModalConfig`` of vLLM 0.27 or earlier: no ``allow_missing_mm_embeddings``."""

    language_model_only: bool = False
    enable_mm_embeds: bool = False
    limits: Mapping[str, int] = attrs.field(factory=dict)

    def get_limit_per_prompt(self, modality: str) -> int:
        if self.language_model_only:
            return 0
        return self.limits.get(modality, DEFAULT_LIMIT)


@attrs.define
class MultiModalConfigStandIn(MultiModalConfigV027):
    """A ``MultiModalConfig`` of vLLM 0.28 or later, as its ``VllmConfig`` resolved it."""

    allow_missing_mm_embeddings: bool = False


@attrs.frozen
class KVTransferConfigStandIn:
    """vLLM's ``KVTransferConfig``: a consumer is a ``kv_consumer`` or ``kv_both`` with a
    connector set."""

    kv_role: str
    kv_connector: str | None = "TransferConnector"

    @property
    def is_kv_consumer(self) -> bool:
        return self.kv_connector is not None and self.kv_role in {"kv_consumer", "kv_both"}


@attrs.define
class ModelConfigV030:
    """A ``ModelConfig`` of vLLM 0.30 or earlier: no ``supports_multimodal_inputs``."""

    multimodal_config: MultiModalConfigV027 | None
    supported: tuple[str, ...] = ("image", "video")

    @property
    def is_multimodal_model(self) -> bool:
        return self.multimodal_config is not None


@attrs.define
class ModelConfigV031(ModelConfigV030):
    """A ``ModelConfig`` of vLLM 0.31 or later, with vLLM's own check as a property."""

    failure: Exception | None = None

    @property
    def supports_multimodal_inputs(self) -> bool:
        if self.failure is not None:
            raise self.failure
        mm = self.multimodal_config
        if mm is None:
            return False
        if all(mm.get_limit_per_prompt(m) == 0 for m in self.supported):
            return mm.enable_mm_embeds
        return True


@attrs.frozen
class ProcessingInfoStandIn:
    supported: tuple[str, ...]

    @property
    def supported_mm_limits(self) -> dict[str, int | None]:
        return dict.fromkeys(self.supported)


def _info(model_config: object) -> ProcessingInfoStandIn:
    if getattr(model_config, "multimodal_config", None) is None:
        raise ValueError("Model class has no registered multimodal processor")
    supported: tuple[str, ...] = getattr(model_config, "supported", ())
    return ProcessingInfoStandIn(supported)


@attrs.define
class RegistryV031:
    """``MULTIMODAL_REGISTRY`` of vLLM 0.31 and later: processing info only."""

    info_failure: Exception | None = None
    probed: int = 0

    def get_processing_info(self, model_config: object) -> ProcessingInfoStandIn:
        if self.info_failure is not None:
            raise self.info_failure
        return _info(model_config)


@attrs.define
class RegistryV030(RegistryV031):
    """``MULTIMODAL_REGISTRY`` of vLLM 0.30 and earlier, with the check as a method."""

    answer: bool | Exception = True

    def supports_multimodal_inputs(self, model_config: object) -> bool:
        self.probed += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@attrs.define
class RegistryPre019:
    """A registry older than ``get_processing_info``: only the private factory."""

    def _create_processing_info(
        self, model_config: object, tokenizer: object = None
    ) -> ProcessingInfoStandIn:
        assert tokenizer is None
        return _info(model_config)


@attrs.frozen
class VllmConfigStandIn:
    model_config: object
    kv_transfer_config: KVTransferConfigStandIn | None = None


@attrs.frozen
class AsyncLLMStandIn:
    vllm_config: VllmConfigStandIn


@attrs.frozen
class LLMEngineStandIn:
    vllm_config: VllmConfigStandIn


@attrs.frozen
class LLMStandIn:
    llm_engine: LLMEngineStandIn


def wrap(
    model_config: object, shape: str, kv_transfer_config: KVTransferConfigStandIn | None = None
) -> object:
    """``model_config`` as the object a caller of the given shape holds."""
    vllm_config = VllmConfigStandIn(model_config, kv_transfer_config)
    shapes: dict[str, object] = {
        "ModelConfig": model_config,
        "VllmConfig": vllm_config,
        "AsyncLLM": AsyncLLMStandIn(vllm_config),
        "LLM": LLMStandIn(LLMEngineStandIn(vllm_config)),
    }
    return shapes[shape]


def install_registry(monkeypatch: pytest.MonkeyPatch, registry: object | None) -> None:
    """Make ``from vllm.multimodal import MULTIMODAL_REGISTRY`` give ``registry``.

    ``None`` makes vLLM unimportable, as on a machine without it.
    """
    if registry is None:
        monkeypatch.setitem(sys.modules, "vllm", None)
        monkeypatch.setitem(sys.modules, "vllm.multimodal", None)
        return
    module = types.ModuleType("vllm.multimodal")
    module.MULTIMODAL_REGISTRY = registry  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.multimodal", module)

"""What a Ray Serve LLM decode replica can serve, read from its own engine.

The same reading as [`pd_policy_vllm`][pd_policy_vllm] makes of a live engine
([`engine_facts`][pd_policy_vllm.facts.engine_facts]: ``language_model_only``, the modality
limits, vLLM's multimodal-input probe across versions, the embeds-only carve-out), turned
into a capability by the core's rules. Read from the engine's ``VllmConfig``, which
is where vLLM settles what the deployment's ``engine_kwargs`` ask for.
"""

from __future__ import annotations

from typing import Any

from pd_policy import (
    Support,
    WorkerCapability,
    derive_accepts_mm_metadata,
    derive_supports_vision,
)
from pd_policy_vllm.facts import engine_facts
from pd_policy_vllm.model_config import model_config_of

__all__ = ["engine_config_of", "replica_capability", "uses_mrope"]


def engine_config_of(engine: Any) -> Any:
    """The ``VllmConfig`` of a Ray LLM server's engine (its ``VLLMEngine``'s client).

    Raises ``TypeError`` when the engine holds none (not started, or not vLLM)."""
    client = getattr(engine, "_engine_client", None)
    config = getattr(client, "vllm_config", None)
    if config is None:
        raise TypeError("the server's engine has no vLLM config to read its capability from")
    return config


def replica_capability(vllm_config: Any) -> WorkerCapability:
    """The capability of an engine built from ``vllm_config``: ``supports_vision`` and
    ``accepts_mm_metadata`` by the core's rules, from the engine's facts."""
    facts = engine_facts(vllm_config)
    return WorkerCapability(
        Support.from_bool(derive_supports_vision(facts)),
        accepts_mm_metadata=Support.from_bool(derive_accepts_mm_metadata(facts)),
    )


def uses_mrope(vllm_config: Any) -> bool:
    """Whether the served model's positions are M-RoPE."""
    return bool(getattr(model_config_of(vllm_config), "uses_mrope", False))

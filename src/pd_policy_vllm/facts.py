"""Gathering [`pd_policy.EngineFacts`][pd_policy.capability.EngineFacts] from a vLLM engine or
config, on any version.

The core's [`pd_policy.derive_supports_vision`][pd_policy.capability.derive_supports_vision] turns
the facts into the
answer; this module only reads them.
"""

from __future__ import annotations

from pd_policy import EngineFacts

from .limits import modality_limits
from .model_config import is_kv_consumer, is_multimodal_model, model_config_of, multimodal_config
from .probe import probe_mm_inputs

__all__ = ["engine_facts"]


def engine_facts(source: object) -> EngineFacts:
    """What ``source`` is, as far as vision goes.

    ``source`` is a vLLM ``LLM``, ``AsyncLLM``, ``VllmConfig`` or ``ModelConfig``.
    Read from a ``VllmConfig`` (or an engine built from one), not from a bare
    ``ModelConfig``, where it matters: vLLM 0.30-0.32 switch ``enable_mm_embeds``
    on for KV consumers while building the ``VllmConfig``.

    - ``is_multimodal_model``: the architecture's answer;
    - ``mm_input_probe``: vLLM's own check
      ([`probe_mm_inputs`][pd_policy_vllm.probe.probe_mm_inputs]);
    - ``enable_mm_embeds`` and ``language_model_only``: from the
      ``MultiModalConfig`` (false for a text-only architecture, and on versions
      that lack the field);
    - ``modality_limits``: every supported modality's effective limit, or
      ``None`` when unreadable ([`modality_limits`][pd_policy_vllm.limits.modality_limits]);
    - ``is_kv_consumer``: the ``VllmConfig``'s KV role (false from a bare
      ``ModelConfig``, which does not know it);
    - ``allow_missing_mm_embeddings``: from the ``MultiModalConfig``, as vLLM
      0.28+ resolves it (false on versions without the field).

    Raises ``TypeError`` when ``source`` is none of the four; a failing probe is
    recorded in the facts, never raised.
    """
    model_config = model_config_of(source)
    mm_config = multimodal_config(model_config)
    return EngineFacts(
        is_multimodal_model=is_multimodal_model(model_config),
        mm_input_probe=probe_mm_inputs(model_config),
        enable_mm_embeds=bool(getattr(mm_config, "enable_mm_embeds", False)),
        language_model_only=bool(getattr(mm_config, "language_model_only", False)),
        modality_limits=modality_limits(model_config),
        is_kv_consumer=is_kv_consumer(source),
        allow_missing_mm_embeddings=bool(getattr(mm_config, "allow_missing_mm_embeddings", False)),
    )

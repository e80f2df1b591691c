"""The per-prompt limit of every modality the model supports.

The set of modalities comes from vLLM's processing info for the model class
(``supported_mm_limits``: Qwen2-VL supports image and video, LLaVA image only),
not from the limits an operator set: a modality left out of
``--limit-mm-per-prompt`` keeps vLLM's default limit and still reaches the
encoder. Each limit is the engine's effective one,
``MultiModalConfig.get_limit_per_prompt(modality)``, which is 0 for every
modality under ``--language-model-only``.
"""

from __future__ import annotations

import logging

from .model_config import multimodal_config

__all__ = ["modality_limits", "supported_modalities"]

logger = logging.getLogger(__name__)


def supported_modalities(model_config: object) -> tuple[str, ...]:
    """The modalities the model class supports, in vLLM's order.

    Reads ``MULTIMODAL_REGISTRY.get_processing_info(model_config)`` (vLLM 0.19+;
    older versions only have ``_create_processing_info(model_config,
    tokenizer=None)``), then its ``supported_mm_limits`` (or the underlying
    ``get_supported_mm_limits()``).

    Raises whatever vLLM raises: ``ImportError`` without vLLM, ``ValueError``
    for a model class with no registered processor.
    """
    from vllm.multimodal import MULTIMODAL_REGISTRY

    registry = MULTIMODAL_REGISTRY
    if hasattr(registry, "get_processing_info"):
        info = registry.get_processing_info(model_config)
    else:
        info = registry._create_processing_info(model_config, tokenizer=None)
    limits = getattr(info, "supported_mm_limits", None)
    if limits is None:
        limits = info.get_supported_mm_limits()
    return tuple(str(modality) for modality in limits)


def modality_limits(model_config: object) -> dict[str, int] | None:
    """``{modality: effective per-prompt limit}`` for every supported modality.

    ``None`` when it cannot be read: a text-only architecture, a vLLM without
    ``get_limit_per_prompt`` or processing info, or any failure on the way
    (logged as a warning, except a missing vLLM, which is expected in
    engine-free use). Never raises.
    """
    mm_config = multimodal_config(model_config)
    if mm_config is None:
        return None
    get_limit = getattr(mm_config, "get_limit_per_prompt", None)
    if get_limit is None:
        return None
    try:
        limits = {modality: get_limit(modality) for modality in supported_modalities(model_config)}
    except ImportError:
        return None
    except Exception:
        logger.warning("could not read the model's supported modalities", exc_info=True)
        return None
    if not all(type(limit) is int and limit >= 0 for limit in limits.values()):
        logger.warning("vLLM reported per-prompt limits that are not counts: %r", limits)
        return None
    return limits

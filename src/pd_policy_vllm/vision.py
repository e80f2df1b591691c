"""The worker-side capability answers a servicer gives: ``supports_vision`` and the
media-processor advertisement (contract section 6)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from pd_policy import (
    MediaProcessorAdvert,
    advertise_media_processor,
    derive_accepts_mm_metadata,
    derive_supports_vision,
)

from .facts import engine_facts

__all__ = ["accepts_mm_metadata", "media_processor_advert", "supports_vision"]

logger = logging.getLogger(__name__)


def supports_vision(source: object) -> bool:
    """The ``supports_vision`` a worker serving ``source`` reports; never raises.

    The core's [`pd_policy.derive_supports_vision`][pd_policy.capability.derive_supports_vision]
    over
    [`engine_facts`][pd_policy_vllm.facts.engine_facts]. An unexpected failure (``source`` is not
    a vLLM engine or config, say) logs a warning and answers false, as SMG's
    servicer 0.14.1 does: a worker that cannot tell must not attract images.
    """
    try:
        return derive_supports_vision(engine_facts(source))
    except Exception:
        logger.warning(
            "could not tell whether %s encodes media; reporting supports_vision=false",
            type(source).__name__,
            exc_info=True,
        )
        return False


def accepts_mm_metadata(source: object) -> bool:
    """Whether the engine behind ``source`` takes multimodal metadata without an encoder;
    never raises.

    The core's
    [`pd_policy.derive_accepts_mm_metadata`][pd_policy.capability.derive_accepts_mm_metadata] over
    [`engine_facts`][pd_policy_vllm.facts.engine_facts]: a KV consumer whose config turns on
    ``allow_missing_mm_embeddings`` and ``enable_mm_embeds`` (vLLM 0.30-0.32 do
    both for every consumer, ``--language-model-only`` included). Read it from
    an engine or a ``VllmConfig``: a bare ``ModelConfig`` does not know the KV
    role, and answers false. Any failure logs a warning and answers false,
    which keeps the M-RoPE refusal.
    """
    try:
        return derive_accepts_mm_metadata(engine_facts(source))
    except Exception:
        logger.warning(
            "could not tell whether %s takes multimodal metadata; reporting false",
            type(source).__name__,
            exc_info=True,
        )
        return False


def media_processor_advert(
    engine: object,
    /,
    *,
    configured_processor: str,
    schemes: Iterable[str],
    source: str,
    probe_succeeded: bool,
) -> MediaProcessorAdvert:
    """What a servicer for ``engine`` advertises about worker-side media processing.

    The core's
    [`pd_policy.advertise_media_processor`][pd_policy.capability.advertise_media_processor], with
    ``supports_vision``
    read from ``engine`` (any of [`supports_vision`][pd_policy_vllm.vision.supports_vision]'s
    sources): a processor is
    advertised only when one is configured, the engine encodes media and the
    processor's probe succeeded. ``source`` is the processor's source, as in the
    core. Never raises for a bad ``engine`` (it then advertises nothing).
    """
    return advertise_media_processor(
        configured_processor=configured_processor,
        schemes=schemes,
        source=source,
        supports_vision=supports_vision(engine),
        probe_succeeded=probe_succeeded,
    )

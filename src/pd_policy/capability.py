"""Deriving a worker's honest ``supports_vision`` from facts about its engine.

The facts come from an adapter (``pd_policy_vllm`` reads them off a live vLLM
config, across vLLM versions); the rule lives here, pure, so that every
servicer answers the same way. The rule answers one question: does this engine
have a live encoder that turns raw media into embeddings? A worker that does
not must report ``supports_vision=false`` so the router strips its decode legs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping

import attrs

from .errors import MalformedRequest
from .fields import instance_of
from .worker import VisionSupport

__all__ = [
    "EngineFacts",
    "MediaProcessorAdvert",
    "MmInputProbe",
    "advertise_media_processor",
    "derive_accepts_mm_metadata",
    "derive_supports_vision",
]


class MmInputProbe(enum.Enum):
    """What vLLM's own multimodal-input check answered.

    vLLM 0.31 and later answer through ``ModelConfig.supports_multimodal_inputs``;
    0.30 and earlier through ``MULTIMODAL_REGISTRY.supports_multimodal_inputs``.
    """

    #: The check answered true.
    SUPPORTED = "supported"
    #: The check answered false.
    UNSUPPORTED = "unsupported"
    #: The registry raised ``ValueError``: no multimodal processor is registered.
    NO_PROCESSOR = "no_processor"
    #: The check raised something else; the architecture's answer stands.
    FAILED = "failed"
    #: No check could be run (vLLM not importable); only the architecture is known.
    UNAVAILABLE = "unavailable"


def _to_limits(value: object) -> tuple[tuple[str, int], ...] | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        value = value.items()
    if not isinstance(value, Iterable):
        raise MalformedRequest("modality_limits must map modalities to limits", "modality_limits")
    pairs = tuple(value)
    for pair in pairs:
        if not (
            isinstance(pair, tuple)
            and len(pair) == 2
            and isinstance(pair[0], str)
            and type(pair[1]) is int
            and pair[1] >= 0
        ):
            raise MalformedRequest(
                "modality_limits must map modality names to non-negative limits",
                param="modality_limits",
            )
    return tuple(sorted(pairs))


@attrs.frozen(slots=True)
class EngineFacts:
    """What an engine is, as far as vision goes.

    ``modality_limits`` maps *every modality the model supports* (not only those
    an operator set explicitly: a modality left out keeps vLLM's default limit)
    to its per-prompt limit; ``None`` when the adapter could not read it.
    ``is_kv_consumer``: the engine takes KV from a connector (role
    ``kv_consumer`` or ``kv_both``). ``allow_missing_mm_embeddings``: the
    engine's multimodal config lets an item arrive without its embeddings
    (vLLM 0.28 and later set it on KV consumers; false where the field does
    not exist).
    """

    is_multimodal_model: bool = attrs.field(validator=instance_of(bool))
    mm_input_probe: MmInputProbe = attrs.field(validator=instance_of(MmInputProbe))
    enable_mm_embeds: bool = attrs.field(default=False, validator=instance_of(bool))
    language_model_only: bool = attrs.field(default=False, validator=instance_of(bool))
    modality_limits: tuple[tuple[str, int], ...] | None = attrs.field(
        default=None, converter=_to_limits
    )
    is_kv_consumer: bool = attrs.field(default=False, validator=instance_of(bool))
    allow_missing_mm_embeddings: bool = attrs.field(default=False, validator=instance_of(bool))


def derive_supports_vision(facts: EngineFacts) -> bool:
    """True when the engine can encode raw media itself.

    In order:

    1. a text-only architecture: false (vLLM's check is not consulted);
    2. ``language_model_only``: false. No tower is loaded, even where vLLM
       0.30-0.32 switch ``enable_mm_embeds`` on for KV consumers and its own
       check then answers true;
    3. vLLM's check answered false, or found no processor: false;
    4. every modality the model supports has limit 0: false. With
       ``enable_mm_embeds`` the engine takes precomputed embeddings, but it has
       no encoder for pixels (the embeds-only carve-out);
    5. otherwise true: the check answered true, or failed or was unavailable, in
       which case the architecture's answer stands so a healthy worker is not
       blinded by a probe bug.
    """
    if not facts.is_multimodal_model or facts.language_model_only:
        return False
    if facts.mm_input_probe in (MmInputProbe.UNSUPPORTED, MmInputProbe.NO_PROCESSOR):
        return False
    limits = facts.modality_limits
    return not (limits is not None and all(limit == 0 for _, limit in limits))


def derive_accepts_mm_metadata(facts: EngineFacts) -> bool:
    """True when the engine takes an item's metadata (an M-RoPE grid, its content hash and
    placeholder range) without an encoder, once a connector has loaded the prompt's KV.

    All of these must hold: a multimodal architecture; a KV consumer; vLLM lets
    an item arrive without its embeddings (``allow_missing_mm_embeddings``,
    which vLLM 0.28+ sets on consumers); it takes embedding-only items at all
    (``enable_mm_embeds``: automatic for consumers on 0.30-0.32, an explicit
    flag on 0.28-0.29 and 0.33); and vLLM's own multimodal-input check said
    yes. Anything unknown (an older vLLM, a failed probe) reads false, which
    keeps the M-RoPE refusal.
    """
    return (
        facts.is_multimodal_model
        and facts.is_kv_consumer
        and facts.allow_missing_mm_embeddings
        and facts.enable_mm_embeds
        and facts.mm_input_probe is MmInputProbe.SUPPORTED
    )


@attrs.frozen(slots=True)
class MediaProcessorAdvert:
    """What a servicer puts in ``GetServerInfoResponse`` about worker-side media processing."""

    mm_processor: str = ""
    mm_media_ref_schemes: tuple[str, ...] = ()
    mm_processor_source: str = ""


def advertise_media_processor(
    *,
    configured_processor: str,
    schemes: Iterable[str],
    source: str,
    supports_vision: bool | VisionSupport,
    probe_succeeded: bool,
) -> MediaProcessorAdvert:
    """The media-processor advertisement rule.

    A worker advertises its processor (and the schemes it accepts) only when one
    is configured, its engine takes multimodal input, and the processor's probe
    succeeded; otherwise it advertises nothing, so a router never sends media
    references to a worker that cannot expand them. The source is advertised
    only alongside a processor.
    """
    vision = (
        supports_vision is not VisionSupport.FALSE
        if isinstance(supports_vision, VisionSupport)
        else supports_vision
    )
    if not (configured_processor and vision and probe_succeeded):
        return MediaProcessorAdvert()
    return MediaProcessorAdvert(configured_processor, tuple(schemes), source)

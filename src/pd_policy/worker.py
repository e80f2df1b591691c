"""What a decode worker can do, as far as the policy is concerned."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from .decode_kv import KV_LOAD_FAILURE_LABEL, KV_LOAD_LABEL, DecodeKv
from .encoder_cache import EC_ROLE_LABEL, EncoderCacheRole
from .errors import MalformedRequest
from .fields import instance_of

__all__ = [
    "MM_MEDIA_REF_SCHEMES_LABEL",
    "MM_METADATA_LABEL",
    "MM_PROCESSOR_LABEL",
    "SUPPORTS_VISION_LABEL",
    "Support",
    "VisionSupport",
    "WorkerCapability",
]

#: Worker label that carries ``GetModelInfoResponse.supports_vision``.
SUPPORTS_VISION_LABEL: Final = "supports_vision"
#: Worker label that carries ``GetServerInfoResponse.mm_processor``.
MM_PROCESSOR_LABEL: Final = "mm_processor"
#: Worker label that carries ``GetServerInfoResponse.mm_media_ref_schemes`` (comma-separated).
MM_MEDIA_REF_SCHEMES_LABEL: Final = "mm_media_ref_schemes"
#: Worker label that says a language-model-only worker takes multimodal metadata without an
#: encoder (``true`` / ``false``); see
#: [`WorkerCapability.accepts_mm_metadata`][pd_policy.worker.WorkerCapability.accepts_mm_metadata].
MM_METADATA_LABEL: Final = "accepts_mm_metadata"


class Support(enum.Enum):
    """Whether a worker can do something, as far as it says: tri-state on purpose.

    ``supports_vision``: only a worker that *says* false is language-model-only;
    an old servicer that never reports it stays ``UNKNOWN`` and keeps today's
    behaviour (it is treated as vision-capable). ``accepts_mm_metadata``: only
    a worker that says true gets multimodal metadata without an encoder;
    ``UNKNOWN`` keeps today's refusal.
    """

    TRUE = "true"
    FALSE = "false"
    UNKNOWN = "unknown"

    @classmethod
    def from_bool(cls, value: bool | None) -> Support:
        """``True``/``False`` map to ``TRUE``/``FALSE``; ``None`` to ``UNKNOWN``.

        Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for anything else: a label
        string such as ``"false"`` is truthy, and reading it as ``TRUE`` would mark a
        language-model-only worker vision-capable (labels go through
        [`WorkerCapability.from_labels`][pd_policy.worker.WorkerCapability.from_labels]).
        """
        if value is None:
            return cls.UNKNOWN
        if type(value) is not bool:
            raise MalformedRequest(
                f"a support value must be True, False or None, not {type(value).__name__}",
                param="support",
            )
        return cls.TRUE if value else cls.FALSE

    def to_bool(self) -> bool | None:
        """The inverse of [`from_bool`][pd_policy.worker.Support.from_bool]."""
        return None if self is Support.UNKNOWN else self is Support.TRUE


#: The name ``supports_vision`` was typed with first; the same enum.
VisionSupport = Support

#: Only these exact label values say anything; any other leaves support unknown.
_LABEL_VALUES: Final = {"true": Support.TRUE, "false": Support.FALSE}


def _check_processor(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
    # Any name is accepted ("inprocess" and "redis" today): a newer servicer's processor
    # must not make its capability unreadable.
    if not isinstance(value, str):
        raise MalformedRequest("mm_processor must be a string", param="mm_processor")


def _to_schemes(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise MalformedRequest("mm_media_ref_schemes must be a sequence", "mm_media_ref_schemes")
    items = tuple(value)
    if not all(isinstance(s, str) and s for s in items):
        raise MalformedRequest(
            "mm_media_ref_schemes must hold non-empty strings", param="mm_media_ref_schemes"
        )
    return tuple(s.lower() for s in items)


@attrs.frozen(slots=True)
class WorkerCapability:
    """A worker's advertised capability.

    ``supports_vision`` is tri-state (see [`Support`][pd_policy.worker.Support]).
    ``mm_processor`` is non-empty exactly when the worker processes media
    references itself; ``mm_media_ref_schemes`` are the URL schemes it accepts.
    ``accepts_mm_metadata``: a language-model-only worker that is a KV consumer
    on a vLLM whose config turns on ``allow_missing_mm_embeddings`` takes an
    item's metadata (an M-RoPE grid, its content hash and placeholder range)
    without an encoder, once the connector has loaded the prompt's KV; tri-state,
    and only ``TRUE`` counts.
    """

    supports_vision: Support = attrs.field(default=Support.UNKNOWN, validator=instance_of(Support))
    mm_processor: str = attrs.field(default="", validator=_check_processor)
    mm_media_ref_schemes: tuple[str, ...] = attrs.field(default=(), converter=_to_schemes)
    accepts_mm_metadata: Support = attrs.field(
        default=Support.UNKNOWN, validator=instance_of(Support)
    )
    #: Its role in the encoder cache of E/P/D
    #: ([`EncoderCacheRole`][pd_policy.encoder_cache.EncoderCacheRole]).
    encoder_cache: EncoderCacheRole = attrs.field(
        default=EncoderCacheRole.UNKNOWN, validator=instance_of(EncoderCacheRole)
    )
    #: How it takes the prefill's KV, a decode worker's
    #: ([`DecodeKv`][pd_policy.decode_kv.DecodeKv]): whether a stripped multimodal leg
    #: could be answered image-blind there.
    decode_kv: DecodeKv = attrs.field(factory=DecodeKv, validator=instance_of(DecodeKv))

    @property
    def language_model_only(self) -> bool:
        """True only when the worker explicitly reports no vision support."""
        return self.supports_vision is Support.FALSE

    @property
    def takes_mm_metadata(self) -> bool:
        """A language-model-only worker that says it takes multimodal metadata."""
        return self.supports_vision is Support.FALSE and self.accepts_mm_metadata is Support.TRUE

    @property
    def blind_to_stripped_media(self) -> bool:
        """A language-model-only worker that could answer a stripped multimodal leg
        image-blind ([`DecodeKv.blind_to_stripped_media`][
        pd_policy.decode_kv.DecodeKv.blind_to_stripped_media])."""
        return self.supports_vision is Support.FALSE and self.decode_kv.blind_to_stripped_media

    @property
    def accepts_media_refs(self) -> bool:
        """True when the worker advertises worker-side media processing."""
        return bool(self.mm_processor)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> WorkerCapability:
        """Build from a gateway's flattened worker labels.

        Only the exact value ``"false"`` of
        [`SUPPORTS_VISION_LABEL`][pd_policy.worker.SUPPORTS_VISION_LABEL] makes a
        worker language-model-only, as in the SMG gateway; ``"true"`` makes it
        vision-capable and anything else (or no label) leaves it unknown.
        [`MM_METADATA_LABEL`][pd_policy.worker.MM_METADATA_LABEL] reads the same way;
        [`EC_ROLE_LABEL`][pd_policy.encoder_cache.EC_ROLE_LABEL] takes exactly ``producer``,
        ``consumer`` or ``none``; [`KV_LOAD_LABEL`][pd_policy.decode_kv.KV_LOAD_LABEL] and
        [`KV_LOAD_FAILURE_LABEL`][pd_policy.decode_kv.KV_LOAD_FAILURE_LABEL] their exact
        values ([`DecodeKv.from_labels`][pd_policy.decode_kv.DecodeKv.from_labels]).
        Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] when ``labels`` is not a
        mapping of strings to strings.
        """
        if not isinstance(labels, Mapping):
            raise MalformedRequest(
                f"worker labels must be a mapping, not {type(labels).__name__}", param="labels"
            )
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise MalformedRequest(
                    "worker labels must map strings to strings", param=str(key)[:64]
                )
        support = _LABEL_VALUES.get(labels.get(SUPPORTS_VISION_LABEL, ""), Support.UNKNOWN)
        metadata = _LABEL_VALUES.get(labels.get(MM_METADATA_LABEL, ""), Support.UNKNOWN)
        schemes = labels.get(MM_MEDIA_REF_SCHEMES_LABEL, "")
        return cls(
            supports_vision=support,
            mm_processor=labels.get(MM_PROCESSOR_LABEL, ""),
            mm_media_ref_schemes=tuple(s.strip() for s in schemes.split(",") if s.strip()),
            accepts_mm_metadata=metadata,
            encoder_cache=EncoderCacheRole.from_label(labels.get(EC_ROLE_LABEL)),
            decode_kv=DecodeKv.from_labels(
                labels.get(KV_LOAD_LABEL), labels.get(KV_LOAD_FAILURE_LABEL)
            ),
        )

    def to_labels(self) -> dict[str, str]:
        """The labels [`from_labels`][pd_policy.worker.WorkerCapability.from_labels] reads back into
        an equal capability."""
        labels = {
            MM_PROCESSOR_LABEL: self.mm_processor,
            MM_MEDIA_REF_SCHEMES_LABEL: ",".join(self.mm_media_ref_schemes),
        }
        if self.supports_vision is not Support.UNKNOWN:
            labels[SUPPORTS_VISION_LABEL] = self.supports_vision.value
        if self.accepts_mm_metadata is not Support.UNKNOWN:
            labels[MM_METADATA_LABEL] = self.accepts_mm_metadata.value
        if self.encoder_cache is not EncoderCacheRole.UNKNOWN:
            labels[EC_ROLE_LABEL] = self.encoder_cache.value
        labels.update(self.decode_kv.to_labels())
        return labels

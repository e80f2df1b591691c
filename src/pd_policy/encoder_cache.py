"""The encoder cache of E/P/D: a worker's role in it, and what an encoder hands over.

In encode → prefill → decode, an encoder-only worker (vLLM's ``ec_producer``)
runs the vision encoder and stores each item's output under its content hash; a
prefill worker that consumes the cache (``ec_consumer``) loads the outputs by
hash instead of encoding. The encoder answers with ``ec_transfer_params``, one
entry per item hash: ``{hash: {"item_indices": [...], "metadata": {...}}}``,
where the metadata is what the model publishes of the item without its pixels
(Qwen2-VL's ``image_grid_thw``; LLaVA publishes nothing).

A prefill that looks up a hash the store does not hold is fatal to a vLLM
engine (in-process it hangs; over HTTP the engine dies and every later request
fails), so [`encoder_outputs`][pd_policy.encoder_cache.encoder_outputs] is checked
against every item before a prefill is sent.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from .errors import MalformedRequest, MissingEncoderOutput
from .jsontext import loads_strict
from .request import Request

__all__ = [
    "EC_ROLE_LABEL",
    "EncoderCacheRole",
    "EncoderOutput",
    "encoder_outputs",
    "ensure_encoder_outputs",
]

#: Worker label that carries the worker's encoder-cache role (``producer``, ``consumer``,
#: ``none``); any other value, or none, leaves it unknown.
EC_ROLE_LABEL: Final = "ec_role"


class EncoderCacheRole(enum.Enum):
    """A worker's role in the encoder cache; ``UNKNOWN`` when it does not say."""

    #: Encoder-only: encodes and stores, runs no language model (vLLM's ``ec_producer``).
    PRODUCER = "producer"
    #: Loads encoder outputs by hash instead of encoding (``ec_consumer``, ``ec_both``).
    CONSUMER = "consumer"
    #: No encoder-cache transfer: encodes its own media, if it has an encoder.
    NONE = "none"
    UNKNOWN = "unknown"

    @classmethod
    def from_vllm(cls, ec_role: str | None, ec_connector: str | None) -> EncoderCacheRole:
        """The role of an engine started with ``ec_transfer_config`` ``ec_role`` and
        ``ec_connector`` (both ``None`` without the config).

        As vLLM reads them: a role counts only with a connector; ``ec_both`` produces
        and consumes, so it is a consumer, not encoder-only. Raises
        [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a role vLLM does not know.
        """
        if not ec_connector or ec_role is None:
            return cls.NONE
        roles = {"ec_producer": cls.PRODUCER, "ec_consumer": cls.CONSUMER, "ec_both": cls.CONSUMER}
        if ec_role not in roles:
            raise MalformedRequest("ec_role must be ec_producer, ec_consumer or ec_both", "ec_role")
        return roles[ec_role]

    @classmethod
    def from_label(cls, value: str | None) -> EncoderCacheRole:
        """Exactly ``producer``, ``consumer`` or ``none``; anything else is ``UNKNOWN``."""
        return _LABELS.get(value or "", cls.UNKNOWN)


_LABELS: Final = {
    role.value: role for role in EncoderCacheRole if role is not EncoderCacheRole.UNKNOWN
}


@attrs.frozen(slots=True)
class EncoderOutput:
    """What the encoder handed over for one item: where it stored it, and its metadata."""

    #: The entry as the encoder returned it, as compact JSON text (passed on verbatim).
    entry: str = attrs.field(repr=False)
    #: The item's published metadata (empty when the model publishes none).
    metadata: Mapping[str, Any] = attrs.field(repr=False, factory=dict)


def encoder_outputs(params: Mapping[str, Any] | str | None) -> dict[str, EncoderOutput]:
    """Read the ``ec_transfer_params`` an encode leg returned: item hash -> output.

    ``None`` or an empty object reads as no outputs. Raises
    [`MissingEncoderOutput`][pd_policy.errors.MissingEncoderOutput] (502) for anything
    that is not a JSON object of objects (a malformed answer is no answer), naming
    the parameter, never its content.
    """
    if params is None:
        return {}
    try:
        parsed = loads_strict(params) if isinstance(params, str) else params
    except MalformedRequest:
        parsed = None
    if not isinstance(parsed, Mapping):
        raise MissingEncoderOutput("the encoder's ec_transfer_params are not a JSON object")
    outputs = {}
    for key, entry in parsed.items():
        metadata = entry.get("metadata", {}) if isinstance(entry, Mapping) else None
        if not (isinstance(key, str) and key and isinstance(metadata, Mapping)):
            raise MissingEncoderOutput("an entry of the encoder's ec_transfer_params is malformed")
        text = json.dumps(dict(entry), separators=(",", ":"), sort_keys=True)
        outputs[key] = EncoderOutput(text, dict(metadata))
    return outputs


def ensure_encoder_outputs(request: Request, outputs: Mapping[str, EncoderOutput]) -> None:
    """Refuse to send a prefill that would miss the encoder cache.

    Every item of every batch must have a content hash, and the encoder an output
    under exactly that hash. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400) for a batch with
    media but no hashes (its items cannot be looked up) and
    [`MissingEncoderOutput`][pd_policy.errors.MissingEncoderOutput] (502) for the first
    item the encoder returned nothing for, naming it by position.
    """
    for i, batch in enumerate(request.batches):
        if not batch.mm_hashes:
            raise MalformedRequest(
                "an item without a content hash cannot be looked up in the encoder cache",
                param=f"batches[{i}].mm_hashes",
            )
        for j, digest in enumerate(batch.mm_hashes):
            if digest not in outputs:
                raise MissingEncoderOutput(param=f"batches[{i}].mm_hashes[{j}]")

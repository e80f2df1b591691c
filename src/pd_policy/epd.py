"""E/P/D as policy: which requests take an encode leg, the legs of the chain, and its workers.

Encode → prefill → decode splits the vision encoder off the prefill worker:

1. the **encode leg** is the request with its media, to an encoder-only worker,
   which answers with an output per item hash
   ([`encoder_outputs`][pd_policy.encoder_cache.encoder_outputs]);
2. the **prefill leg**, to a worker that consumes the encoder cache
   ([`encoder_consumer_leg`][pd_policy.epd.encoder_consumer_leg]), carries the
   items' hashes (the encoder's, always: a hash the store does not hold is a miss,
   and a miss kills the engine), their placeholders and the encoder's parameters;
   where the model publishes metadata it carries no pixels (``METADATA``: Qwen2-VL's
   grid), where it publishes none it carries the image (``IMAGE``: LLaVA), and the
   prefill skips its vision tower either way. The KV tag goes on as in P/D
   ([`prefill_leg`][pd_policy.prefill.prefill_leg]);
3. the **decode leg** is P/D's, unchanged.

Nothing reaches a prefill worker before the encoder's answer covers every item.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from typing import TypeVar

import attrs

from .encoder_cache import EncoderCacheRole, EncoderOutput, ensure_encoder_outputs
from .errors import MalformedRequest
from .legs import mm_identity
from .request import Request
from .selection import DecodeCandidate

__all__ = [
    "ConsumerPrefill",
    "PrefillForm",
    "encode_leg",
    "encoder_consumer_leg",
    "needs_encode_leg",
    "select_encoder_workers",
    "select_prefill_workers",
]

T = TypeVar("T")


class PrefillForm(enum.Enum):
    """What the prefill leg of a cache consumer carries of each item."""

    #: The image rides along; the prefill loads its encoding by hash and skips the tower.
    IMAGE = "image"
    #: No pixels: hashes, placeholders and the metadata the model publishes (a grid).
    METADATA = "metadata"


def needs_encode_leg(request: Request) -> bool:
    """Whether ``request`` takes an encode leg: it carries preprocessed media batches.

    Media references are not encoded ahead: their items have no hashes until a
    worker fetches them, so they take P/D's path.
    """
    return bool(request.batches) and not request.media_refs


def encode_leg(request: Request) -> Request:
    """The encode leg: the request with its media, one sample, without KV parameters.

    The encoder runs no language model: it needs the items, not a handoff.
    """
    return request._derive_trusted(n=1, kv_transfer_params=None, kv_legacy=None)


@attrs.frozen(slots=True)
class ConsumerPrefill:
    """The prefill leg for a worker that consumes the encoder cache."""

    form: PrefillForm
    #: The leg, before its KV tag ([`prefill_leg`][pd_policy.prefill.prefill_leg]).
    leg: Request
    #: The encoder's outputs for the leg's items, as the JSON object text the engine takes.
    ec_transfer_params: str = attrs.field(repr=False)


def encoder_consumer_leg(request: Request, outputs: Mapping[str, EncoderOutput]) -> ConsumerPrefill:
    """Build the prefill leg of ``request`` for a cache consumer, from the encoder's
    ``outputs``.

    ``METADATA`` when the encoder published metadata for every item: each batch
    keeps its hashes, placeholders and inline grids
    ([`mm_identity`][pd_policy.legs.mm_identity]), no pixels; ``IMAGE`` otherwise: the
    batches as they are. Raises, before anything is built,
    [`MissingEncoderOutput`][pd_policy.errors.MissingEncoderOutput] (502) for an item
    the encoder did not answer for, and
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400) for a batch without
    hashes or, in the ``METADATA`` form, without one placeholder range per item (the
    engine asserts their counts agree and dies when they do not).
    """
    ensure_encoder_outputs(request, outputs)
    items = [h for b in request.batches for h in b.mm_hashes]
    form = PrefillForm.METADATA if all(outputs[h].metadata for h in items) else PrefillForm.IMAGE
    if form is PrefillForm.METADATA:
        batches = []
        for i, batch in enumerate(request.batches):
            if len(batch.placeholders) != len(batch.mm_hashes):
                raise MalformedRequest(
                    "a prefill without pixels needs one placeholder range per item",
                    param=f"batches[{i}].placeholders",
                )
            identity = mm_identity(batch)
            assert identity is not None  # every batch has hashes: checked
            batches.append(identity)
        leg = request._derive_trusted(batches=tuple(batches), media_refs=())
    else:
        leg = request
    entries = ",".join(f"{json.dumps(h)}:{outputs[h].entry}" for h in dict.fromkeys(items))
    return ConsumerPrefill(form, leg, "{" + entries + "}")


def select_encoder_workers(candidates: Sequence[DecodeCandidate[T]]) -> list[DecodeCandidate[T]]:
    """The encoder-only producers among ``candidates``, in the caller's order.

    Only a worker that says it is one counts: an unknown role may run the language
    model, and its answer would not be an encoder's. Empty when none is listed: the
    request then takes P/D's path.
    """
    return [c for c in candidates if c.worker.encoder_cache is EncoderCacheRole.PRODUCER]


def select_prefill_workers(
    request: Request, candidates: Sequence[DecodeCandidate[T]], *, encoded: bool
) -> list[DecodeCandidate[T]]:
    """The prefill candidates that can serve ``request``, in the caller's order.

    After an encode leg (``encoded``), the cache consumers. Otherwise, for a request
    with media, the workers with an encoder of their own (not language-model-only,
    not encoder-only); for text, any worker that runs the language model. Never a
    worker that cannot serve the request while one that can is listed: the list
    is empty only when none can.
    """
    runs_lm = [c for c in candidates if c.worker.encoder_cache is not EncoderCacheRole.PRODUCER]
    if encoded:
        return [c for c in runs_lm if c.worker.encoder_cache is EncoderCacheRole.CONSUMER]
    if request.has_mm_inputs or request.media_refs:
        return [c for c in runs_lm if not c.worker.language_model_only]
    return runs_lm

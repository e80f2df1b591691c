"""Which form the decode leg of a sequential P/D request takes, or why it cannot exist."""

from __future__ import annotations

import enum

from .errors import (
    MediaRefsOnLanguageModelOnlyDecode,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
)
from .media_errors import MissingMediaIdentity
from .mrope import has_mrope_grids, mrope_metadata_gap
from .request import Request
from .wire_errors import MediaOnBlindDecode
from .worker import WorkerCapability

__all__ = ["DecodeForm", "decide_decode_form", "sequential_pd_decode_form", "unidentified_media"]


class DecodeForm(enum.Enum):
    """The shape of the decode leg."""

    #: Everything, pixels included: decode recomputes the prompt and runs its encoder (n>1).
    FULL = "full"
    #: Per-batch identity and inline grids, no pixels: decode takes prefill's KV.
    IDENTITY_ONLY = "identity_only"
    #: Expanded ids, KV parameters and per-item hashes only: for a language-model-only decode.
    TEXT_PLUS_HASHES = "text_plus_hashes"
    #: Expanded ids, KV parameters, and per batch the hashes, placeholders and inline M-RoPE
    #: grids, no pixels: for a language-model-only decode that takes multimodal metadata.
    MROPE_METADATA = "mrope_metadata"


def decide_decode_form(
    *,
    language_model_only: bool,
    n: int,
    has_mrope_grids: bool,
    has_media_refs: bool,
    has_mm_inputs: bool,
    takes_mm_metadata: bool = False,
    metadata_gap: MropeOnLanguageModelOnlyDecode | None = None,
    unidentified: str | None = None,
    blind_to_stripped_media: bool = False,
) -> DecodeForm:
    """The decision of [`sequential_pd_decode_form`][pd_policy.decision.sequential_pd_decode_form],
    over the facts it reads.

    Adapters that read the facts straight off a wire message call this, so that
    the decision has one implementation. ``n`` of 0 means one sample.
    ``takes_mm_metadata``: the worker is language-model-only and says it takes
    multimodal metadata
    ([`takes_mm_metadata`][pd_policy.worker.WorkerCapability.takes_mm_metadata]);
    ``metadata_gap``: what [`mrope_metadata_gap`][pd_policy.mrope.mrope_metadata_gap] found
    missing for such a worker (``None``: nothing). ``unidentified``: where the first
    batch that carries media without content hashes is (its ``mm_hashes`` field, as the
    adapter names it), or ``None``
    ([`unidentified_media`][pd_policy.decision.unidentified_media]).
    ``blind_to_stripped_media``: the worker could answer a stripped multimodal leg
    image-blind ([`blind_to_stripped_media`][
    pd_policy.worker.WorkerCapability.blind_to_stripped_media]). Raises the same
    carve-out errors, in the same order.
    """
    relay_kv = n <= 1
    if not language_model_only:
        if not relay_kv:
            return DecodeForm.FULL
        if unidentified is not None:
            raise MissingMediaIdentity(param=unidentified)
        return DecodeForm.IDENTITY_ONLY
    if has_mrope_grids:
        if not takes_mm_metadata:
            raise MropeOnLanguageModelOnlyDecode()
        if has_media_refs:
            raise MediaRefsOnLanguageModelOnlyDecode()
        if not relay_kv:
            # Without a handoff, decode would have to encode the image itself.
            raise NSamplesOnLanguageModelOnlyDecode()
        if metadata_gap is not None:
            raise metadata_gap
        if blind_to_stripped_media:
            raise MediaOnBlindDecode()
        return DecodeForm.MROPE_METADATA
    if has_media_refs:
        raise MediaRefsOnLanguageModelOnlyDecode()
    if not relay_kv and has_mm_inputs:
        raise NSamplesOnLanguageModelOnlyDecode()
    if unidentified is not None:
        raise MissingMediaIdentity(param=unidentified)
    if blind_to_stripped_media and has_mm_inputs:
        # The leg carries no pixels; only the prefill's KV keeps the answer sighted.
        raise MediaOnBlindDecode()
    return DecodeForm.TEXT_PLUS_HASHES


def unidentified_media(request: Request) -> str | None:
    """Where the first batch is that carries media (pixels, tensors or placeholders) but no
    content hashes (``batches[i].mm_hashes``), or ``None``.

    Such a batch has no identity: the stripped and identity-only legs drop it whole
    ([`clone_without_mm`][pd_policy.legs.clone_without_mm], as upstream does), so the
    decode worker would take the prefill's KV for its items under ids alone, and serve it
    to the next request whose media differs. A batch with nothing at all is no media.
    """
    for i, batch in enumerate(request.batches):
        if not batch.mm_hashes and (batch.carries_payload or batch.placeholders):
            return f"batches[{i}].mm_hashes"
    return None


def sequential_pd_decode_form(request: Request, decode_worker: WorkerCapability) -> DecodeForm:
    """Pick the decode leg's form for ``request`` on ``decode_worker``.

    A worker that is not language-model-only (vision-capable or unknown) gets
    ``IDENTITY_ONLY`` when the KV handoff applies (n<=1) and ``FULL`` otherwise.
    A language-model-only worker gets ``TEXT_PLUS_HASHES`` (text requests too,
    n>1 included) unless a carve-out applies, checked in this order:

    1. M-RoPE grid tensors:
       [`MropeOnLanguageModelOnlyDecode`][pd_policy.errors.MropeOnLanguageModelOnlyDecode],
       unless the worker takes multimodal metadata
       ([`takes_mm_metadata`][pd_policy.worker.WorkerCapability.takes_mm_metadata]). Such a worker
       gets ``MROPE_METADATA`` for n<=1 when every batch carries what it needs
       ([`mrope_metadata_gap`][pd_policy.mrope.mrope_metadata_gap]), and otherwise the media
       references, n>1 or M-RoPE refusal that says what is missing;
    2. media references:
       [`MediaRefsOnLanguageModelOnlyDecode`][pd_policy.errors.MediaRefsOnLanguageModelOnlyDecode];
    3. n>1 with multimodal batches:
       [`NSamplesOnLanguageModelOnlyDecode`][pd_policy.errors.NSamplesOnLanguageModelOnlyDecode].

    Beyond upstream, a leg that would take the prefill's KV (``IDENTITY_ONLY``,
    ``TEXT_PLUS_HASHES``) for a batch that carries media without content hashes is
    refused with [`MissingMediaIdentity`][pd_policy.media_errors.MissingMediaIdentity]
    (see [`unidentified_media`][pd_policy.decision.unidentified_media]), after the
    carve-outs; and a stripped leg with media (``TEXT_PLUS_HASHES`` with multimodal
    batches, ``MROPE_METADATA``) for a worker that could answer it image-blind
    ([`blind_to_stripped_media`][pd_policy.worker.WorkerCapability.blind_to_stripped_media])
    is refused with [`MediaOnBlindDecode`][pd_policy.wire_errors.MediaOnBlindDecode], last.
    All of them are non-retryable 400s.
    """
    grids = has_mrope_grids(request)
    metadata = decode_worker.takes_mm_metadata
    return decide_decode_form(
        language_model_only=decode_worker.language_model_only,
        n=request.n,
        has_mrope_grids=grids,
        has_media_refs=bool(request.media_refs),
        has_mm_inputs=request.has_mm_inputs,
        takes_mm_metadata=metadata,
        metadata_gap=mrope_metadata_gap(request) if metadata and grids else None,
        unidentified=unidentified_media(request),
        blind_to_stripped_media=decode_worker.blind_to_stripped_media,
    )

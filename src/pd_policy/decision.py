"""Which form the decode leg of a sequential P/D request takes, or why it cannot exist."""

from __future__ import annotations

import enum

from .errors import (
    MediaRefsOnLanguageModelOnlyDecode,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
)
from .mrope import has_mrope_grids
from .request import Request
from .worker import WorkerCapability

__all__ = ["DecodeForm", "decide_decode_form", "sequential_pd_decode_form"]


class DecodeForm(enum.Enum):
    """The shape of the decode leg."""

    #: Everything, pixels included: decode recomputes the prompt and runs its encoder (n>1).
    FULL = "full"
    #: Per-batch identity and inline grids, no pixels: decode takes prefill's KV.
    IDENTITY_ONLY = "identity_only"
    #: Expanded ids, KV parameters and per-item hashes only: for a language-model-only decode.
    TEXT_PLUS_HASHES = "text_plus_hashes"


def decide_decode_form(
    *,
    language_model_only: bool,
    n: int,
    has_mrope_grids: bool,
    has_media_refs: bool,
    has_mm_inputs: bool,
) -> DecodeForm:
    """The decision of :func:`sequential_pd_decode_form`, over the facts it reads.

    Adapters that read the facts straight off a wire message call this, so that
    the decision has one implementation. ``n`` of 0 means one sample.
    Raises the same carve-out errors, in the same order.
    """
    relay_kv = n <= 1
    if not language_model_only:
        return DecodeForm.IDENTITY_ONLY if relay_kv else DecodeForm.FULL
    if has_mrope_grids:
        raise MropeOnLanguageModelOnlyDecode()
    if has_media_refs:
        raise MediaRefsOnLanguageModelOnlyDecode()
    if not relay_kv and has_mm_inputs:
        raise NSamplesOnLanguageModelOnlyDecode()
    return DecodeForm.TEXT_PLUS_HASHES


def sequential_pd_decode_form(request: Request, decode_worker: WorkerCapability) -> DecodeForm:
    """Pick the decode leg's form for ``request`` on ``decode_worker``.

    A worker that is not language-model-only (vision-capable or unknown) gets
    ``IDENTITY_ONLY`` when the KV handoff applies (n<=1) and ``FULL`` otherwise.
    A language-model-only worker gets ``TEXT_PLUS_HASHES`` (text requests too,
    n>1 included) unless a carve-out applies, checked in this order:

    1. M-RoPE grid tensors: :class:`~pd_policy.errors.MropeOnLanguageModelOnlyDecode`;
    2. media references: :class:`~pd_policy.errors.MediaRefsOnLanguageModelOnlyDecode`;
    3. n>1 with multimodal batches:
       :class:`~pd_policy.errors.NSamplesOnLanguageModelOnlyDecode`.

    All three are non-retryable 400s.
    """
    return decide_decode_form(
        language_model_only=decode_worker.language_model_only,
        n=request.n,
        has_mrope_grids=has_mrope_grids(request),
        has_media_refs=bool(request.media_refs),
        has_mm_inputs=request.has_mm_inputs,
    )

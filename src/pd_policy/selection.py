"""Choosing decode workers before dispatch, and refusing media no worker can take.

Upstream refuses an incompatible pairing only at dispatch, after the router has
preprocessed the images. A router that knows each decode worker's capability
can do better: never pick a language-model-only worker for a request it cannot
serve while a capable one is available, and refuse media up front when no
worker of the model has an encoder.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Generic, TypeVar

import attrs

from .decision import decide_decode_form, unidentified_media
from .errors import MultimodalNotSupported, NoDecodeWorkerAvailable, PolicyError
from .mrope import has_mrope_grids, mrope_metadata_gap
from .request import Request
from .worker import Support, WorkerCapability

__all__ = ["DecodeCandidate", "ensure_model_accepts_media", "select_decode_workers"]

T = TypeVar("T")


@attrs.frozen(slots=True)
class DecodeCandidate(Generic[T]):
    """A decode worker the router could pick: its capability and the caller's own handle.

    ``handle`` is opaque to the policy: a worker id, a load or score, a client.
    """

    worker: WorkerCapability
    handle: T


def select_decode_workers(
    request: Request, candidates: Sequence[DecodeCandidate[T]]
) -> list[DecodeCandidate[T]]:
    """The candidates that can serve ``request``, in the caller's order of preference.

    A candidate can serve it exactly when
    [`pd_policy.sequential_pd_decode_form`][pd_policy.decision.sequential_pd_decode_form]
    would not raise for it. The decision depends on the worker only through
    whether it is language-model-only, whether it takes multimodal metadata and
    whether it could answer a stripped multimodal leg image-blind, so it is made at
    most once for each kind of worker; each candidate costs one read of its capability.
    A request with media thus skips a decode whose KV connector matches by content
    hash, loads nothing, or recomputes a failed load, while another fits.

    Raises, when no candidate can serve the request, the carve-out error that
    explains why (for the first candidate in the caller's order), before any
    preprocessing; [`NoDecodeWorkerAvailable`][pd_policy.errors.NoDecodeWorkerAvailable] (503)
    when there are no candidates at all.
    """
    if not candidates:
        raise NoDecodeWorkerAvailable()
    refusals: dict[tuple[bool, bool, bool], PolicyError | None] = {}
    first_refusal: PolicyError | None = None
    chosen: list[DecodeCandidate[T]] = []
    for candidate in candidates:
        worker = candidate.worker
        kind = (
            worker.language_model_only,
            worker.takes_mm_metadata,
            worker.blind_to_stripped_media,
        )
        if kind not in refusals:
            refusals[kind] = _refusal(
                request, language_model_only=kind[0], metadata=kind[1], blind=kind[2]
            )
        refusal = refusals[kind]
        if refusal is None:
            chosen.append(candidate)
        elif first_refusal is None:
            first_refusal = refusal
    if not chosen:
        assert first_refusal is not None  # every candidate refused
        raise first_refusal
    return chosen


def _refusal(
    request: Request, *, language_model_only: bool, metadata: bool, blind: bool
) -> PolicyError | None:
    grids = has_mrope_grids(request)
    try:
        decide_decode_form(
            language_model_only=language_model_only,
            n=request.n,
            has_mrope_grids=grids,
            has_media_refs=bool(request.media_refs),
            has_mm_inputs=request.has_mm_inputs,
            takes_mm_metadata=metadata,
            metadata_gap=mrope_metadata_gap(request) if metadata and grids else None,
            unidentified=unidentified_media(request),
            blind_to_stripped_media=blind,
        )
    except PolicyError as exc:
        return exc
    return None


def ensure_model_accepts_media(
    request: Request, workers: Iterable[WorkerCapability], *, model: str | None = None
) -> None:
    """Refuse a multimodal request when every registered worker of the model lacks an encoder.

    Runs before any preprocessing. A request with batches or media references
    is refused with [`MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported] (400) only
    when the pool is non-empty and every worker says ``supports_vision=false``;
    an empty pool, a mixed one, or one with a worker that does not say passes.
    ``model`` only names the model in the message.
    """
    if not (request.has_mm_inputs or request.media_refs):
        return
    pool = iter(workers)
    saw_any = False
    for worker in pool:
        saw_any = True
        if worker.supports_vision is not Support.FALSE:
            return
    if saw_any:
        named = f" by model {model!r}" if model else ""
        raise MultimodalNotSupported(
            f"multimodal input is not supported{named}: its workers run as a language model "
            "only, without a vision encoder"
        )

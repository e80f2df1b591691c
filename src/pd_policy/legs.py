"""Building the decode leg: what each [`DecodeForm`][pd_policy.decision.DecodeForm] keeps of the
request.

Every builder is pure: the input request is never changed (the prefill leg must
stay byte-for-byte what the router built, pixels and references included).
"""

from __future__ import annotations

from .batch import MultimodalBatch
from .decision import DecodeForm, decide_decode_form, sequential_pd_decode_form
from .errors import MissingKvTransferParams, MultimodalNotSupported
from .mrope import MROPE_GRID_KEYS, grids_kept_on_cpu, has_mrope_grids, mrope_metadata_gap
from .request import Request
from .worker import WorkerCapability

__all__ = [
    "build_decode_leg",
    "clone_without_mm",
    "decode_leg",
    "ensure_language_model_only_leg",
    "hash_identity",
    "identity_only",
    "metadata_only",
    "mm_identity",
]


def hash_identity(batch: MultimodalBatch) -> MultimodalBatch | None:
    """The batch reduced to its content hashes and modality; ``None`` if it has no hashes."""
    if not batch.mm_hashes:
        return None
    return batch.hashes_only()


def clone_without_mm(request: Request) -> Request:
    """The text-plus-hashes decode leg.

    Keeps the request id, the expanded ``input_ids`` (or text), ``n``, both KV
    parameter forms verbatim and the caller's ``cache_salt``. Each batch becomes
    its hashes and modality, in order; a batch without hashes is dropped whole.
    Media references are dropped. The result carries no pixels, tensors,
    placeholders or media references, and applying it twice changes nothing.
    """
    kept = tuple(h for h in map(hash_identity, request.batches) if h is not None)
    if kept == request.batches and not request.media_refs:
        return request
    return request._derive_trusted(batches=kept, media_refs=())


def mm_identity(batch: MultimodalBatch) -> MultimodalBatch | None:
    """The batch's identity without pixels; ``None`` if it has no hashes.

    Keeps the modality, hashes, placeholders, image token id and encoder input
    key, and of the model-specific tensors only the M-RoPE grids whose payload
    is inline. A grid flattened by a sizes tensor that is not inline is dropped
    with its mapping (one leg cannot forward half of a flattened pair).
    ``batched_keys`` and ``keep_on_cpu_keys`` keep only the tensors that remain.

    Beyond upstream: every kept grid is listed in ``keep_on_cpu_keys``
    ([`grids_kept_on_cpu`][pd_policy.mrope.grids_kept_on_cpu]).
    """
    if not batch.mm_hashes:
        return None
    grids = {t.name: t for t in batch.tensors if t.name in MROPE_GRID_KEYS and t.is_inline}
    flat = dict(batch.flat_keys)
    for key, sizes in flat.items():
        if key in grids:
            sizes_tensor = batch.tensor(sizes)
            if sizes_tensor is None or not sizes_tensor.is_inline:
                del grids[key]
    kept_flat = tuple((k, s) for k, s in batch.flat_keys if k in grids)
    kept = dict(grids)
    for _, sizes in kept_flat:
        sizes_tensor = batch.tensor(sizes)
        assert sizes_tensor is not None  # checked above
        kept[sizes] = sizes_tensor
    return MultimodalBatch(
        modality=batch.modality,
        tensors=tuple(kept.values()),
        placeholders=batch.placeholders,
        mm_hashes=batch.mm_hashes,
        im_token_id=batch.im_token_id,
        batched_keys=tuple(k for k in batch.batched_keys if k in kept),
        flat_keys=kept_flat,
        keep_on_cpu_keys=grids_kept_on_cpu(batch, kept),
        encoder_input_key=batch.encoder_input_key,
    )


def identity_only(request: Request) -> Request:
    """The identity-only decode leg, for a vision-capable decode worker that takes KV.

    Each batch becomes [`mm_identity`][pd_policy.legs.mm_identity] of itself (hash-less batches are
    dropped); media references are kept, since that worker expands them itself.
    Everything else is kept verbatim.
    """
    kept = tuple(i for i in map(mm_identity, request.batches) if i is not None)
    return request._derive_trusted(batches=kept)


def metadata_only(request: Request) -> Request:
    """The M-RoPE metadata decode leg, for a language-model-only worker that takes it.

    Each batch becomes [`mm_identity`][pd_policy.legs.mm_identity] of itself: its hashes,
    placeholders,
    image token id and inline M-RoPE grids (with their sizes tensors), every
    grid listed in ``keep_on_cpu_keys``; no pixels and no other tensor. Media
    references are dropped. The ids, the KV parameters and the caller's salt
    are kept (the worker's vLLM keys its prefix-cache blocks by the hashes).

    Raises [`MropeOnLanguageModelOnlyDecode`][pd_policy.errors.MropeOnLanguageModelOnlyDecode] when
    the
    request lacks what such a worker needs
    ([`mrope_metadata_gap`][pd_policy.mrope.mrope_metadata_gap]),
    so no incomplete leg is ever built.
    """
    gap = mrope_metadata_gap(request)
    if gap is not None:
        raise gap
    kept = tuple(i for i in map(mm_identity, request.batches) if i is not None)
    return request._derive_trusted(batches=kept, media_refs=())


def decode_leg(request: Request, form: DecodeForm) -> Request:
    """The decode leg of ``request`` in ``form`` (``FULL`` is the request itself)."""
    if form is DecodeForm.TEXT_PLUS_HASHES:
        return clone_without_mm(request)
    if form is DecodeForm.IDENTITY_ONLY:
        return identity_only(request)
    if form is DecodeForm.MROPE_METADATA:
        return metadata_only(request)
    return request


def build_decode_leg(
    request: Request, decode_worker: WorkerCapability
) -> tuple[DecodeForm, Request]:
    """Decide the form for ``decode_worker`` and build the leg.

    Raises the carve-out errors of
    [`sequential_pd_decode_form`][pd_policy.decision.sequential_pd_decode_form].
    """
    form = sequential_pd_decode_form(request, decode_worker)
    return form, decode_leg(request, form)


def ensure_language_model_only_leg(
    leg: Request, *, uses_mrope: bool = False, takes_mm_metadata: bool = False
) -> None:
    """Refuse a leg that a language-model-only engine cannot serve, before the engine sees it.

    The worker-side guard: a leg for such an engine must be a plain token prompt
    plus content hashes. Raises, in this order, the decision's carve-outs
    (M-RoPE grids, media references, n>1 with batches), then
    [`MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported] for a batch that still
    carries pixels, tensors or placeholders. vLLM would otherwise fail deep in
    its input processor ("exceeds the pre-allocated encoder cache size 0").

    ``uses_mrope`` is the worker's own knowledge that its model's positions are
    M-RoPE (vLLM's ``ModelConfig.uses_mrope``). A stripped leg has lost its grids,
    so only the worker can tell: a leg that still names media is then refused
    with [`MropeOnLanguageModelOnlyDecode`][pd_policy.errors.MropeOnLanguageModelOnlyDecode], since
    decode
    would rotate the image's tokens, and every token after them, as text.

    ``takes_mm_metadata``: the engine takes multimodal metadata without an
    encoder (a KV consumer with ``allow_missing_mm_embeddings``). It then also
    serves an M-RoPE metadata leg ([`metadata_only`][pd_policy.legs.metadata_only]): one complete
    for
    it ([`mrope_metadata_gap`][pd_policy.mrope.mrope_metadata_gap]), with no pixels and no
    tensor but its grids and their sizes, and with the prefill's KV parameters.
    A metadata leg without them is refused with
    [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams]: vLLM would try to
    encode the image, and with no encoder its engine dies (in-process, the next
    request hangs).
    """
    grids = has_mrope_grids(leg)
    metadata = takes_mm_metadata and grids
    decide_decode_form(
        language_model_only=True,
        n=leg.n,
        has_mrope_grids=grids or (uses_mrope and leg.has_mm_inputs),
        has_media_refs=bool(leg.media_refs),
        has_mm_inputs=leg.has_mm_inputs,
        takes_mm_metadata=metadata,
        metadata_gap=mrope_metadata_gap(leg) if metadata else None,
    )
    for i, batch in enumerate(leg.batches):
        if metadata and batch.pixel_values is None and batch == mm_identity(batch):
            continue
        if batch.carries_payload or batch.placeholders:
            raise MultimodalNotSupported(
                "this worker runs as a language model only, without a vision encoder, and the "
                "request still carries multimodal pixels, tensors or placeholders; send the "
                "stripped decode leg (input_ids, kv_transfer_params and content hashes)",
                param=f"batches[{i}]",
            )
    if metadata and not leg.has_kv_transfer_params:
        raise MissingKvTransferParams(
            "this M-RoPE metadata leg carries no kv_transfer_params: without the prefill's KV "
            "the engine would have to encode the image, and it has no vision encoder"
        )

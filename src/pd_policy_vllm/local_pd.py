"""A sequential P/D driver for vLLM engines running in one process.

It is the policy, end to end, on real engines: a vision prefill engine and a
decode engine (typically ``language_model_only=True``) joined by a KV connector
that follows the ``kv_transfer_params`` handoff contract (for example
:mod:`pd_policy_vllm.transfer_connector`). It is the basis of the live P/D tests
and of ``examples/live_pd.py``; it is not a server.

:meth:`LocalPd.generate` works in the order a router does:

0. describe the request as the router would see it after preprocessing: the
   images' content hashes (passed to vLLM as ``multi_modal_uuids``, so the
   engines' identities are the router's), an M-RoPE grid when the model uses
   M-RoPE, ``n`` and the caller's salt; then ask the policy for the decode form.
   A carve-out is refused here, before either engine sees the request;
1. prefill on the vision engine with ``max_tokens=1``, the handoff requested
   (``do_remote_decode``) when it applies (n<=1);
2. read the parameters the prefill returned and its expanded prompt;
3. build the decode leg from the expanded request, relay the parameters, and
   run the post-prefill check (the 502 for a stripped image leg without them);
4. decode. A text-plus-hashes leg goes to the engine as a token prompt with the
   folded ``cache_salt``; the other forms (a vision-capable decode engine) get
   the original multimodal prompt and the relayed parameters.

A decode engine whose connector reports what it loaded (as
``TransferConnector`` does) is checked too: a stripped image leg that loaded
nothing is the same 502, never an image-blind answer.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from pd_policy import (
    DecodeForm,
    MissingKvTransferParams,
    Modality,
    MultimodalBatch,
    PayloadLocation,
    Request,
    TensorDescriptor,
    VisionSupport,
    WorkerCapability,
    decode_leg,
    ensure_kv_handoff,
    relay_kv,
    sequential_pd_decode_form,
)

from .model_config import model_config_of
from .prompt import KV_TRANSFER_PARAMS_KEY, decode_inputs
from .vision import supports_vision

if TYPE_CHECKING:
    from PIL.Image import Image
    from vllm import LLM, RequestOutput, SamplingParams

__all__ = ["LocalPd", "PdResult", "image_content_hash"]


def image_content_hash(image: Image) -> str:
    """A content hash of an image: its mode, size and pixels (what the router hashes)."""
    digest = hashlib.sha256(f"{image.mode}:{image.width}x{image.height}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()


@attrs.frozen(slots=True)
class PdResult:
    """One request served through prefill and decode."""

    form: DecodeForm
    #: The decode leg the policy built (after the KV relay).
    leg: Request
    #: The generated tokens (the prefill's first token is not repeated here).
    token_ids: tuple[int, ...]
    #: Their summed log-probability, when the sampling parameters asked for logprobs.
    cumulative_logprob: float | None
    #: What the prefill engine returned about the handoff.
    prefill_kv_params: dict[str, Any] | None
    #: What the decode engine's connector reported (``loaded_tokens``,
    #: ``local_cached_tokens``), if it reports.
    decode_kv_report: dict[str, Any] | None
    #: The ``cache_salt`` the decode prompt carried.
    cache_salt: str | None


class LocalPd:
    """Serve requests through an in-process prefill ``LLM`` and decode ``LLM``.

    ``decode_worker`` defaults to the decode engine's honest capability
    (:func:`pd_policy_vllm.supports_vision`). ``fold_salt=False`` sends the
    decode leg without its media identities, as gateways did before the fold:
    it exists to show the prefix-cache hazard, never use it otherwise.
    """

    def __init__(
        self,
        prefill: LLM,
        decode: LLM,
        *,
        decode_worker: WorkerCapability | None = None,
        fold_salt: bool = True,
    ) -> None:
        self.prefill = prefill
        self.decode = decode
        if decode_worker is None:
            decode_worker = WorkerCapability(VisionSupport.from_bool(supports_vision(decode)))
        self.decode_worker = decode_worker
        self.fold_salt = fold_salt
        prefill_config = model_config_of(prefill)
        self._uses_mrope = bool(getattr(prefill_config, "uses_mrope", False))
        self._decode_uses_mrope = bool(getattr(model_config_of(decode), "uses_mrope", False))

    def describe(
        self,
        prompt: str,
        images: Sequence[Image] = (),
        *,
        n: int = 1,
        cache_salt: str | None = None,
        request_id: str | None = None,
    ) -> Request:
        """The request as a router sees it after preprocessing, before prefill."""
        batches: tuple[MultimodalBatch, ...] = ()
        if images:
            # Descriptors only: the policy decides, the engine gets the images.
            side = max(max(i.width, i.height) for i in images)
            pixels = TensorDescriptor(
                "pixel_values", (len(images), 3, side, side), "float32", PayloadLocation.INLINE
            )
            grids = (
                (TensorDescriptor("image_grid_thw", (len(images), 3), "int64"),)
                if self._uses_mrope
                else ()
            )
            batches = (
                MultimodalBatch(
                    modality=Modality.IMAGE,
                    pixel_values=pixels,
                    tensors=grids,
                    mm_hashes=tuple(image_content_hash(i) for i in images),
                ),
            )
        return Request(
            request_id or uuid.uuid4().hex,
            text=prompt,
            batches=batches,
            n=n,
            cache_salt=cache_salt,
        )

    def generate(
        self,
        prompt: str,
        images: Sequence[Image] = (),
        sampling_params: SamplingParams | None = None,
        *,
        cache_salt: str | None = None,
        request_id: str | None = None,
    ) -> PdResult:
        """Serve one request; see the module docs for the steps.

        Raises the policy's carve-out errors (before any engine call) and
        :class:`pd_policy.MissingKvTransferParams` (after prefill, before decode).
        """
        from vllm import SamplingParams

        sampling = sampling_params or SamplingParams(max_tokens=16, temperature=0.0)
        request = self.describe(
            prompt, images, n=sampling.n, cache_salt=cache_salt, request_id=request_id
        )
        form = sequential_pd_decode_form(request, self.decode_worker)

        engine_prompt: dict[str, Any] = {"prompt": prompt}
        if images:
            engine_prompt["multi_modal_data"] = {"image": list(images)}
            engine_prompt["multi_modal_uuids"] = {"image": list(request.batches[0].mm_hashes)}
        handoff = {"do_remote_decode": True} if request.relays_kv else None
        prefill_sampling = SamplingParams(
            max_tokens=1,
            temperature=0.0,
            extra_args={KV_TRANSFER_PARAMS_KEY: handoff} if handoff else None,
        )
        prefilled: RequestOutput = self.prefill.generate(
            [engine_prompt], prefill_sampling, use_tqdm=False
        )[0]
        returned = prefilled.kv_transfer_params

        expanded = request.derive(input_ids=tuple(prefilled.prompt_token_ids or ()), text=None)
        # The form depends on n, grids, refs and batches, which expansion does not change.
        leg = decode_leg(expanded, form)
        leg = relay_kv(leg, _handoff_only(returned))
        ensure_kv_handoff(expanded, form, leg)

        if form is DecodeForm.TEXT_PLUS_HASHES:
            stripped = leg if self.fold_salt else leg.derive(batches=())
            inputs = decode_inputs(
                stripped,
                sampling,
                language_model_only=self.decode_worker.language_model_only,
                uses_mrope=self._decode_uses_mrope,
            )
            decoded = self.decode.generate([inputs.prompt], inputs.sampling_params, use_tqdm=False)
            salt = inputs.prompt.get("cache_salt")
        else:
            # A vision-capable decode engine recomputes the media itself.
            decode_sampling = sampling.clone()
            if leg.relays_kv and leg.kv_transfer_params is not None:
                extra = dict(decode_sampling.extra_args or {})
                extra[KV_TRANSFER_PARAMS_KEY] = leg.kv_transfer_params_dict()
                decode_sampling.extra_args = extra
            decoded = self.decode.generate([engine_prompt], decode_sampling, use_tqdm=False)
            salt = None
        output = decoded[0]
        report = output.kv_transfer_params
        if (
            form is DecodeForm.TEXT_PLUS_HASHES
            and expanded.has_mm_inputs
            and report is not None
            and "loaded_tokens" in report
            and not report["loaded_tokens"]
            and not report.get("local_cached_tokens")
        ):
            raise MissingKvTransferParams(
                "the decode engine loaded none of the prefill's KV for this multimodal "
                "request, and a language-model-only decode cannot recompute it"
            )
        return PdResult(
            form=form,
            leg=leg,
            token_ids=tuple(output.outputs[0].token_ids),
            cumulative_logprob=output.outputs[0].cumulative_logprob,
            prefill_kv_params=returned,
            decode_kv_report=report,
            cache_salt=salt,
        )


def _handoff_only(params: dict[str, Any] | None) -> dict[str, Any] | None:
    # vLLM adds its own bookkeeping (remote_prefill_cached_tokens) to what the
    # connector returned; relay the connector's parameters as they are otherwise.
    if params is None:
        return None
    return {k: v for k, v in params.items() if k != "remote_prefill_cached_tokens"}

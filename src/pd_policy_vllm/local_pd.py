"""A sequential P/D driver for vLLM engines running in one process.

It is the policy, end to end, on real engines: a vision prefill engine and a
decode engine (typically ``language_model_only=True``) joined by a KV connector
that follows the ``kv_transfer_params`` handoff contract (for example
[`pd_policy_vllm.transfer_connector`][pd_policy_vllm.transfer_connector]). It is the basis of the
live P/D tests
and of ``examples/live_pd.py``; it is not a server.

[`LocalPd.generate`][pd_policy_vllm.local_pd.LocalPd.generate] works in the order a router does:

0. describe the request as the router sees it after router-side media
   processing ([`pd_policy_vllm.preprocess`][pd_policy_vllm.preprocess]): the expanded ids, the
   images' content hashes (passed to vLLM as ``multi_modal_uuids``, so the
   engines' identities are the router's), their placeholder ranges, the
   M-RoPE grid when the model has one, ``n`` and the caller's salt; then ask
   the policy for the decode form. A carve-out is refused here, before either
   engine sees the request;
1. prefill on the vision engine with ``max_tokens=1``, the handoff requested
   (``do_remote_decode``) when it applies (n<=1), and check that it expanded
   the prompt to the router's ids;
2. read the parameters the prefill returned (and, for text, its prompt ids);
3. build the decode leg, relay the parameters, and run the post-prefill check
   (the 502 for an image leg without them);
4. decode. A text-plus-hashes leg goes to the engine as a token prompt with the
   folded ``cache_salt``; an M-RoPE metadata leg as the expanded ids with each
   image's grid, hash and placeholder and no pixels; the other forms (a
   vision-capable decode engine) get the original multimodal prompt and the
   relayed parameters.

A decode engine whose connector reports what it loaded (as
``TransferConnector`` does) is checked too: a stripped image leg that loaded
nothing is the same 502, never an image-blind answer.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from pd_policy import (
    DecodeForm,
    KvConnectorMode,
    MissingKvTransferParams,
    Request,
    Support,
    WorkerCapability,
    connector_mode,
    decode_leg,
    ensure_kv_handoff,
    relay_kv,
    sequential_pd_decode_form,
)

from .engine import generate_one
from .model_config import kv_connector_of, model_config_of
from .preprocess import Preprocessed, image_content_hash, image_token_id, preprocess
from .prompt import KV_TRANSFER_PARAMS_KEY, decode_inputs
from .vision import accepts_mm_metadata, supports_vision

if TYPE_CHECKING:
    from PIL.Image import Image
    from vllm import LLM, RequestOutput, SamplingParams

__all__ = ["LocalPd", "PdResult", "image_content_hash"]


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
    #: Each generated token's log-probability, when the sampling parameters asked.
    logprobs: tuple[float, ...] | None = None


class LocalPd:
    """Serve requests through an in-process prefill ``LLM`` and decode ``LLM``.

    ``decode_worker`` defaults to the decode engine's honest capability
    ([`pd_policy_vllm.supports_vision`][pd_policy_vllm.vision.supports_vision] and
    [`pd_policy_vllm.accepts_mm_metadata`][pd_policy_vllm.vision.accepts_mm_metadata]).
    ``fold_salt=False`` sends the
    decode leg without its media identities, as gateways did before the fold:
    it exists to show the prefix-cache hazard, never use it otherwise.
    ``kv_mode`` is the prefill connector's handoff contract, by default read off the
    prefill engine's ``kv_transfer_config``
    ([`connector_mode`][pd_policy.wires.connector_mode], which raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a connector it
    does not know).
    """

    def __init__(
        self,
        prefill: LLM,
        decode: LLM,
        *,
        decode_worker: WorkerCapability | None = None,
        fold_salt: bool = True,
        kv_mode: KvConnectorMode | None = None,
    ) -> None:
        self.prefill = prefill
        self.kv_mode = kv_mode if kv_mode is not None else connector_mode(kv_connector_of(prefill))
        self.decode = decode
        # The decode engine's own answer: its guard runs whatever the router believes.
        self._decode_takes_metadata = accepts_mm_metadata(decode)
        if decode_worker is None:
            decode_worker = WorkerCapability(
                Support.from_bool(supports_vision(decode)),
                accepts_mm_metadata=Support.from_bool(self._decode_takes_metadata),
            )
        self.decode_worker = decode_worker
        self.fold_salt = fold_salt
        prefill_config: Any = model_config_of(prefill)
        self._model = str(prefill_config.model)
        self._image_token = image_token_id(getattr(prefill_config, "hf_config", None))
        self._decode_uses_mrope = bool(getattr(model_config_of(decode), "uses_mrope", False))

    def preprocess(self, prompt: str, images: Sequence[Image]) -> Preprocessed:
        """Router-side processing of ``prompt`` and ``images`` with the model's processor."""
        if self._image_token is None:
            raise ValueError(f"{self._model} has no image placeholder: it takes no images")
        return preprocess(self._model, self._image_token, prompt, images)

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
        return self._routed(prompt, images, n, cache_salt, request_id)[0]

    def _routed(
        self,
        prompt: str,
        images: Sequence[Image],
        n: int,
        cache_salt: str | None,
        request_id: str | None,
    ) -> tuple[Request, Preprocessed | None]:
        request_id = request_id or uuid.uuid4().hex
        if not images:
            return Request(request_id, text=prompt, n=n, cache_salt=cache_salt), None
        routed = self.preprocess(prompt, images)
        request = Request(
            request_id,
            input_ids=routed.input_ids,
            batches=(routed.batch,),
            n=n,
            cache_salt=cache_salt,
        )
        return request, routed

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
        [`pd_policy.MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams] (after
        prefill, before decode).
        """
        from vllm import SamplingParams

        sampling = sampling_params or SamplingParams(max_tokens=16, temperature=0.0)
        request, routed = self._routed(prompt, images, sampling.n, cache_salt, request_id)
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
        engine_ids = tuple(prefilled.prompt_token_ids or ())
        if request.input_ids is None:
            request = request.derive(input_ids=engine_ids, text=None)
        elif request.input_ids != engine_ids:
            raise RuntimeError("the prefill engine expanded the prompt unlike the router")

        leg = relay_kv(decode_leg(request, form), _handoff_only(returned))
        ensure_kv_handoff(request, form, leg, self.kv_mode)

        salt = None
        if form in (DecodeForm.TEXT_PLUS_HASHES, DecodeForm.MROPE_METADATA):
            unsalted = not self.fold_salt and form is DecodeForm.TEXT_PLUS_HASHES
            stripped = leg.derive(batches=()) if unsalted else leg
            inputs = decode_inputs(
                stripped,
                sampling,
                language_model_only=self.decode_worker.language_model_only,
                uses_mrope=self._decode_uses_mrope,
                takes_mm_metadata=self._decode_takes_metadata,
                grids=[routed.grid_values] if routed is not None else None,
            )
            output = generate_one(self.decode, inputs, request.request_id)
            salt = inputs.prompt.get("cache_salt")
        else:
            # A vision-capable decode engine recomputes the media itself.
            decode_sampling = sampling.clone()
            if leg.relays_kv and leg.kv_transfer_params is not None:
                extra = dict(decode_sampling.extra_args or {})
                extra[KV_TRANSFER_PARAMS_KEY] = leg.kv_transfer_params_dict()
                decode_sampling.extra_args = extra
            output = self.decode.generate([engine_prompt], decode_sampling, use_tqdm=False)[0]
        report = output.kv_transfer_params
        if (
            form is DecodeForm.TEXT_PLUS_HASHES
            and request.has_mm_inputs
            and report is not None
            and "loaded_tokens" in report
            and not report["loaded_tokens"]
            and not report.get("local_cached_tokens")
        ):
            raise MissingKvTransferParams(
                "the decode engine loaded none of the prefill's KV for this multimodal "
                "request, and a language-model-only decode cannot recompute it"
            )
        completion = output.outputs[0]
        return PdResult(
            form=form,
            leg=leg,
            token_ids=tuple(completion.token_ids),
            cumulative_logprob=completion.cumulative_logprob,
            prefill_kv_params=returned,
            decode_kv_report=report,
            cache_salt=salt,
            logprobs=_sampled_logprobs(completion),
        )


def _sampled_logprobs(completion: Any) -> tuple[float, ...] | None:
    # vLLM gives, per generated token, a dict of candidate token -> Logprob.
    if completion.logprobs is None:
        return None
    return tuple(
        float(step[token].logprob)
        for token, step in zip(completion.token_ids, completion.logprobs, strict=True)
    )


def _handoff_only(params: dict[str, Any] | None) -> dict[str, Any] | None:
    # vLLM adds its own bookkeeping (remote_prefill_cached_tokens) to what the
    # connector returned; relay the connector's parameters as they are otherwise.
    if params is None:
        return None
    return {k: v for k, v in params.items() if k != "remote_prefill_cached_tokens"}

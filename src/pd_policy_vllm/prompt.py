"""The engine input for a decode leg: a token prompt with the folded salt, and sampling
parameters that carry the KV handoff where vLLM's connectors read it.

A decode leg reaches vLLM as a plain prompt: the prefill-expanded ids, never
multimodal data. The core keeps tensor descriptors, not tensor bytes, so a leg
that still carries pixels, tensors (M-RoPE grids included) or media references
cannot be turned into a vLLM prompt here; it is refused with a typed error
instead of reaching the engine half-built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from pd_policy import (
    MalformedRequest,
    MultimodalNotSupported,
    Request,
    decode_cache_salt,
    ensure_language_model_only_leg,
    has_mrope_grids,
)

from .metadata_input import GridValues, metadata_engine_input

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.inputs import TextPrompt, TokensPrompt

__all__ = ["KV_TRANSFER_PARAMS_KEY", "DecodeInputs", "decode_inputs", "kv_transfer_params"]

#: The ``SamplingParams.extra_args`` key vLLM's KV connectors read the handoff from.
KV_TRANSFER_PARAMS_KEY = "kv_transfer_params"


@attrs.frozen(slots=True)
class DecodeInputs:
    """What to pass to ``LLM.generate`` (or ``AsyncLLM.generate``) for one decode leg.

    ``prompt`` is a ``TokensPrompt`` (or, for a text leg, a ``TextPrompt``; for
    an M-RoPE metadata leg, vLLM's pre-rendered multimodal input) and
    ``sampling_params`` a copy of the caller's. Both are vLLM's own mutable
    types: the value is frozen, its contents are the engine's to consume.
    """

    prompt: TokensPrompt | TextPrompt | dict[str, Any]
    sampling_params: SamplingParams

    @property
    def prerendered(self) -> bool:
        """A pre-rendered input: submit it with ``llm_engine.add_request``, never with
        ``LLM.generate``, which drops its multimodal part without a word and answers with
        text positions ([`pd_policy_vllm.generate_one`][pd_policy_vllm.engine.generate_one] does it
        right)."""
        return self.prompt.get("type") == "multimodal"


def kv_transfer_params(leg: Request) -> dict[str, Any] | None:
    """The leg's KV handoff as the dict vLLM's connectors read, or ``None``.

    The JSON form is parsed as is. The legacy typed form (Mooncake without an
    engine id) is passed under its wire field names, ``remote_host`` and
    ``remote_port``; the JSON form wins when a leg carries both.
    """
    params = leg.kv_transfer_params_dict()
    if params is None and leg.kv_legacy is not None:
        params = {
            "remote_host": leg.kv_legacy.remote_host,
            "remote_port": leg.kv_legacy.remote_port,
        }
    return params


def _ensure_token_prompt_leg(leg: Request) -> None:
    if leg.media_refs:
        raise MultimodalNotSupported(
            "this decode worker builds token prompts only and does not expand media "
            "references; send the prefill-expanded input_ids",
            param="media_refs",
        )
    for i, batch in enumerate(leg.batches):
        if batch.carries_payload:
            raise MultimodalNotSupported(
                "this decode worker builds token prompts only, and the leg still carries "
                "multimodal pixels or tensors; send the stripped decode leg (input_ids, "
                "kv_transfer_params and content hashes)",
                param=f"batches[{i}]",
            )
    if leg.input_ids is None and leg.batches:
        raise MalformedRequest(
            "a multimodal decode leg needs the prefill-expanded input_ids: its text would be "
            "tokenized again without the media's placeholder run",
            param="input_ids",
        )


def _copy_sampling_params(
    sampling_params: SamplingParams, params: dict[str, Any] | None
) -> SamplingParams:
    copied = sampling_params.clone()
    # A fresh dict: clone() is shallow under skip_clone, and the caller's must not change.
    extra = {k: v for k, v in (copied.extra_args or {}).items() if k != KV_TRANSFER_PARAMS_KEY}
    if params is not None:
        extra[KV_TRANSFER_PARAMS_KEY] = params
    copied.extra_args = extra or None
    return copied


def decode_inputs(
    leg: Request,
    sampling_params: SamplingParams,
    *,
    language_model_only: bool,
    uses_mrope: bool = False,
    takes_mm_metadata: bool = False,
    grids: GridValues | None = None,
) -> DecodeInputs:
    """Build the engine input for a decode leg.

    With ``language_model_only`` (the engine has no vision encoder), the core's guard
    [`pd_policy.ensure_language_model_only_leg`][pd_policy.legs.ensure_language_model_only_leg]
    runs first, so a leg
    with M-RoPE grids, media references, n>1 with media, or pixels, tensors or
    placeholders gets the core's typed error before vLLM sees anything. With
    ``uses_mrope`` too (the model's positions are M-RoPE, as Qwen2-VL's), a leg
    that carries media identities is refused with
    [`pd_policy.MropeOnLanguageModelOnlyDecode`][pd_policy.errors.MropeOnLanguageModelOnlyDecode]
    even once stripped of its
    grids: the engine would rotate the image's tokens as text, and every
    generated token after them, without an error.

    With ``takes_mm_metadata`` (the engine is a KV consumer that allows missing
    embeddings, [`pd_policy_vllm.accepts_mm_metadata`][pd_policy_vllm.vision.accepts_mm_metadata]),
    an M-RoPE
    metadata leg ([`pd_policy.metadata_only`][pd_policy.legs.metadata_only]) passes the guard when
    it is
    complete and carries the prefill's KV parameters, and becomes vLLM's
    pre-rendered multimodal input of its expanded ids, hashes, placeholders and
    grids ([`metadata_engine_input`][pd_policy_vllm.metadata_input.metadata_engine_input]), whose
    values ``grids`` gives per batch; without them,
    [`pd_policy.MalformedRequest`][pd_policy.errors.MalformedRequest] (``param="grids"``).

    Then, for any other leg, on any engine:

    - the prompt is a ``TokensPrompt`` of the leg's ``input_ids`` with
      ``cache_salt`` = [`pd_policy.decode_cache_salt`][pd_policy.salt.decode_cache_salt] (the
      caller's salt,
      folded with the media's identities; no key when both are absent);
    - a text leg (no ids) becomes a ``TextPrompt`` with the same salt, as SMG's
      servicer serves text, but only without media: a multimodal text leg would
      be tokenized again without its placeholder run, so it is refused
      ([`pd_policy.MalformedRequest`][pd_policy.errors.MalformedRequest], ``param="input_ids"``);
    - a leg still carrying pixels, tensors or media references is refused with
      [`pd_policy.MultimodalNotSupported`][pd_policy.errors.MultimodalNotSupported]: the core has no
      tensor bytes to
      build multimodal data from;
    - ``sampling_params`` is copied (the caller's is never changed) and the copy's
      ``extra_args["kv_transfer_params"]`` is the leg's KV handoff
      ([`kv_transfer_params`][pd_policy_vllm.prompt.kv_transfer_params]); the leg decides, so a
      handoff left in the
      caller's ``extra_args`` is dropped when the leg has none;
    - ``sampling_params.n`` must equal ``leg.n`` (the n the policy decided on),
      else [`pd_policy.MalformedRequest`][pd_policy.errors.MalformedRequest] with ``param="n"``.
    """
    if language_model_only:
        ensure_language_model_only_leg(
            leg, uses_mrope=uses_mrope, takes_mm_metadata=takes_mm_metadata
        )
    requested_n = getattr(sampling_params, "n", 1)
    if requested_n != leg.n:
        raise MalformedRequest(
            f"the sampling parameters ask for n={requested_n}, but the leg was planned "
            f"for n={leg.n}",
            param="n",
        )
    params = _copy_sampling_params(sampling_params, kv_transfer_params(leg))
    if takes_mm_metadata and has_mrope_grids(leg):
        if grids is None:
            raise MalformedRequest("a metadata leg needs its grids' values", param="grids")
        return DecodeInputs(metadata_engine_input(leg, grids), params)
    _ensure_token_prompt_leg(leg)

    from vllm.inputs import TextPrompt, TokensPrompt

    prompt: TokensPrompt | TextPrompt
    if leg.input_ids is not None:
        prompt = TokensPrompt(prompt_token_ids=list(leg.input_ids))
    else:
        assert leg.text is not None  # a Request holds exactly one of the two
        prompt = TextPrompt(prompt=leg.text)
    salt = decode_cache_salt(leg)
    if salt is not None:
        prompt["cache_salt"] = salt
    return DecodeInputs(prompt, params)

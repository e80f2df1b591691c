"""E/P/D over vLLM's scale-out routes: the encode leg, and a cache consumer's prefill leg.

With an encoder-only worker configured (vLLM's ``ec_producer``, started with
``--enable-scale-out``), a chat request with media runs encode → prefill →
decode:

1. the encoder's server renders the request (``RENDER``): the expanded ids, and
   per item its hash, placeholder, processed tensors (``kwargs_data``) and
   metadata-only item (``mm_metadata``);
2. the **encode leg** is the rendered request, whole, to the encoder's
   ``GENERATE``: it stores each item's encoding under the rendered hash and
   answers with ``ec_transfer_params``, one entry per hash;
3. the **prefill leg**, to a worker that consumes the encoder cache, is the
   rendered request with the encoder's parameters and the KV tag. Where the model
   publishes metadata (Qwen2-VL's grid) its items are metadata-only: no pixel
   reaches the prefill. Where it publishes none (LLaVA) the items stay whole, and
   the prefill skips its vision tower. Nothing is sent before the encoder's answer
   covers every item
   ([`encoder_consumer_leg`][pd_policy.epd.encoder_consumer_leg]): a prefill that
   misses its encoder cache kills a vLLM engine;
4. the decode leg is P/D's (see [`plan`][pd_policy_vllm.openai.plan.steps]).

The render runs on the encoder, so the hashes the encoder stores under are the
ones the prefill looks up: the generate route takes them from the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pd_policy import (
    EncoderOutput,
    KvHandoff,
    PrefillForm,
    Request,
    encoder_consumer_leg,
    encoder_outputs,
)
from pd_policy_vllm.openai.plan.scale_out import Rendered, prefill_generate_body
from pd_policy_vllm.openai.wire.codec import loads

__all__ = ["consumer_prefill_body", "encode_generate_body", "read_encode"]


def encode_generate_body(rendered: Rendered) -> dict[str, Any]:
    """The encode leg: the rendered request whole, one token, no stream, no KV parameters.

    An encoder-only engine runs no language model; it finishes the request once its
    items are stored."""
    leg = dict(rendered.body)
    sampling = dict(leg.get("sampling_params") or {})
    sampling.update(max_tokens=1, min_tokens=0, n=1)
    leg.update(sampling_params=sampling, stream=False, stream_options=None)
    leg.update(kv_transfer_params=None, output_mode="tokens")
    return leg


def read_encode(response: Any) -> dict[str, EncoderOutput]:
    """The encoder's outputs from its generate response, by item hash.

    Raises [`MissingEncoderOutput`][pd_policy.errors.MissingEncoderOutput] (502) for
    malformed ``ec_transfer_params``; an answer without them reads as no outputs (the
    prefill leg then refuses every item)."""
    params = response.get("ec_transfer_params") if isinstance(response, Mapping) else None
    return encoder_outputs(params)


def consumer_prefill_body(
    rendered: Rendered, request: Request, outputs: Mapping[str, EncoderOutput], handoff: KvHandoff
) -> tuple[PrefillForm, dict[str, Any]]:
    """The prefill leg for a cache consumer: its form and its generate body.

    ``request`` is the request as rendered
    ([`rendered_request`][pd_policy_vllm.openai.plan.scale_out.rendered_request]). Raises, before
    anything is built, what [`encoder_consumer_leg`][pd_policy.epd.encoder_consumer_leg]
    raises: [`MissingEncoderOutput`][pd_policy.errors.MissingEncoderOutput] (502) for an
    item the encoder did not answer for, under the hash the prefill would look up.
    """
    built = encoder_consumer_leg(request, outputs)
    leg = prefill_generate_body(rendered, handoff)
    features = dict(leg.get("features") or {})
    if built.form is PrefillForm.METADATA:
        features.pop("kwargs_data", None)  # no pixels: the grid rides in the metadata items
        features["mm_metadata"] = rendered.metadata
    leg["features"] = features
    leg["ec_transfer_params"] = loads(built.ec_transfer_params)
    return built.form, leg

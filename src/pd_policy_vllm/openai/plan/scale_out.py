"""The M-RoPE metadata path over vLLM's scale-out endpoints: render, generate, derender.

A language-model-only decode worker that takes an M-RoPE image's metadata
(``MROPE_METADATA``) needs, per image, its content hash, its placeholder range
and its grid; the proxy processes no media, so it asks the prefill worker's
server to render the chat request (``POST /v1/chat/completions/render``):
the expanded ids, and per item the hash, the placeholder and the processed
tensors, both whole (``kwargs_data``: pixels and grid) and metadata-only
(``mm_metadata``: the grid). Then, all through ``/inference/v1/generate``:

- the prefill leg is the rendered request, whole, sampled to one token and
  tagged for the handoff: the prefill worker does not process the image twice;
- the decode leg is the rendered request with metadata-only items, the relayed
  KV parameters and the client's sampling, stream and salt: no pixels;
- the decode's token output becomes a chat completion (or its stream of
  chunks) through the decode server's ``/v1/chat/completions/derender``.

The metadata-only items travel as ``kwargs_data``: vLLM 0.32's generate route
takes items that lack their pixels under ``mm_metadata`` only with encoder-cache
transfer parameters (E/P/D), and as ``kwargs_data`` it builds the same engine
input. Every route here needs the worker started with ``--enable-scale-out``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from pd_policy import (
    KvHandoff,
    MalformedRequest,
    Modality,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
    WorkerStreamError,
)
from pd_policy_vllm.openai.media.parts import without_media
from pd_policy_vllm.openai.wire.codec import loads, token_ids

__all__ = [
    "DERENDER",
    "GENERATE",
    "RENDER",
    "Derender",
    "Rendered",
    "metadata_decode_body",
    "prefill_generate_body",
    "read_render",
    "rendered_request",
]

#: The scale-out routes (vLLM 0.32, ``--enable-scale-out``).
RENDER: Final = "/v1/chat/completions/render"
GENERATE: Final = "/inference/v1/generate"
DERENDER: Final = "/v1/chat/completions/derender"

_GRIDS: Final = {Modality.IMAGE: "image_grid_thw", Modality.VIDEO: "video_grid_thw"}


def _bad_render(detail: str) -> WorkerStreamError:
    return WorkerStreamError("prefill", "", f"the render response {detail}", http_status=502)


@attrs.frozen(slots=True)
class Rendered:
    """What the prefill worker's server rendered for a chat request."""

    #: The rendered request (vLLM's ``GenerateRequest``), as sent.
    body: dict[str, Any]
    #: The expanded prompt ids.
    token_ids: tuple[int, ...]
    #: Per modality, in order: content hashes, placeholders, metadata-only items.
    mm_hashes: dict[str, list[str]]
    placeholders: dict[str, list[dict[str, int]]]
    metadata: dict[str, list[str]]


def _per_modality(features: Mapping[str, Any], key: str) -> dict[str, list[Any]]:
    value = features.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise _bad_render(f"has a features.{key} that is not an object of lists")
    return value


def read_render(response: Mapping[str, Any], *, metadata: bool = True) -> Rendered:
    """Read a render response. Raises a ``prefill_stream_error`` (502) unless it has the
    ids, and per item a hash, a placeholder range and (with ``metadata``, as the M-RoPE
    path needs) a metadata-only item: without it the decode worker could not place
    the image's rotary positions."""
    ids = token_ids(response.get("token_ids"))
    if ids is None:
        raise _bad_render("has no token_ids")
    features = response.get("features")
    if not isinstance(features, Mapping):
        raise _bad_render("has no multimodal features")
    hashes = _per_modality(features, "mm_hashes")
    placeholders = _per_modality(features, "mm_placeholders")
    metas_of = _per_modality(features, "mm_metadata")
    for modality, items in hashes.items():
        ranges = placeholders.get(modality, [])
        metas = metas_of.get(modality, []) if metadata else ["-"] * len(items)
        if not (len(items) == len(ranges) == len(metas)):
            raise _bad_render(f"does not give every {modality} a placeholder and metadata")
        for item, where, meta in zip(items, ranges, metas, strict=True):
            if not isinstance(item, str) or not item:
                raise _bad_render(f"has a {modality} without a content hash")
            if not (isinstance(where, dict) and {"offset", "length"} <= where.keys()):
                raise _bad_render(f"has a {modality} placeholder without offset and length")
            if not isinstance(meta, str) or not meta:
                raise _bad_render(f"has a {modality} without metadata (its M-RoPE grid)")
    if not hashes:
        raise _bad_render("has no multimodal items")
    if not set(hashes) <= {m.value for m in Modality}:
        raise _bad_render(f"has a modality this policy does not know: {sorted(hashes)}")
    return Rendered(dict(response), ids, hashes, placeholders, metas_of)


def rendered_request(request: Request, rendered: Rendered, *, mrope: bool = True) -> Request:
    """``request`` (the body as the policy saw it before rendering) as rendered: the
    expanded ids, and per modality the rendered hashes, placeholders and, for an
    ``mrope`` model, an inline grid (its values are inside the metadata items the
    decode leg carries).

    Raises a ``prefill_stream_error`` (502) for placeholders that are not ranges of
    the ids: the render's fault, not the client's.
    """
    try:
        return _rendered_request(request, rendered, mrope)
    except MalformedRequest as exc:
        raise _bad_render(f"does not describe its items: {exc.message}") from None


def _rendered_request(request: Request, rendered: Rendered, mrope: bool) -> Request:
    batches = []
    for name, hashes in rendered.mm_hashes.items():
        modality = Modality(name)
        ranges = [PlaceholderRange(p["offset"], p["length"]) for p in rendered.placeholders[name]]
        tensors: tuple[TensorDescriptor, ...] = ()
        if mrope and modality in _GRIDS:
            rows = (len(hashes), 3)
            tensors = (TensorDescriptor(_GRIDS[modality], rows, "int64", PayloadLocation.INLINE),)
        batch = MultimodalBatch(
            modality=modality, tensors=tensors, placeholders=ranges, mm_hashes=hashes
        )
        batches.append(batch)
    return request.derive(input_ids=rendered.token_ids, batches=batches, text=None)


def prefill_generate_body(rendered: Rendered, handoff: KvHandoff) -> dict[str, Any]:
    """The prefill leg: the rendered request whole (pixels included), one token, no stream,
    the prompt ids returned, tagged for the handoff. Raises ``ValueError`` for a
    handoff that runs no prefill."""
    if not handoff.runs_prefill:
        raise ValueError("this handoff runs no prefill leg (n>1: decode runs alone)")
    leg = dict(rendered.body)
    sampling = dict(leg.get("sampling_params") or {})
    sampling.update(max_tokens=1, min_tokens=0, n=1)
    leg.update(sampling_params=sampling, stream=False, stream_options=None)
    leg.update(return_token_ids=True, output_mode="tokens")
    leg["kv_transfer_params"] = (
        loads(handoff.prefill_params) if handoff.prefill_params is not None else None
    )
    return leg


def metadata_decode_body(rendered: Rendered, leg: Request) -> dict[str, Any]:
    """The decode leg: the rendered request with metadata-only items and no pixels, the
    relayed KV parameters (``leg``'s) and ``leg``'s salt; the client's sampling and
    stream, as rendered. Token output, for the derender."""
    out = dict(rendered.body)
    out["features"] = {
        "mm_hashes": rendered.mm_hashes,
        "mm_placeholders": rendered.placeholders,
        "kwargs_data": rendered.metadata,
    }
    out.update(kv_transfer_params=leg.kv_transfer_params_dict(), output_mode="tokens")
    out["cache_salt"] = leg.cache_salt
    return out


@attrs.frozen(slots=True)
class Derender:
    """How to turn the decode's token output back into the client's chat completion: the
    decode server's derender route, and what every call carries besides the output
    (the prompt, for usage and detokenization, and the client's request without its
    media, for tool and reasoning parsing)."""

    route: str
    template: dict[str, Any]

    @classmethod
    def for_request(cls, body: Mapping[str, Any], rendered: Rendered) -> Derender:
        """The derender of a chat ``body`` that was rendered as ``rendered``."""
        chat = {**body, "messages": without_media(body)}
        template = {
            "model": rendered.body.get("model") or body.get("model"),
            "prompt_tokens": len(rendered.token_ids),
            "prompt_token_ids": list(rendered.token_ids),
            "chat_request": chat,
        }
        return cls(DERENDER, template)

    def whole(self, response: Any) -> dict[str, Any]:
        """The derender request for a whole (non-streamed) generate response."""
        chat = {**self.template["chat_request"], "stream": False}
        chat.pop("stream_options", None)
        return {
            **self.template,
            "chat_request": chat,
            "stream": False,
            "generate_response": response,
        }

    def with_prompt_ids(self, answer: Any) -> Any:
        """``answer`` (a derendered completion, or the first chunk of a stream) with the
        prompt's ids, when the client asked for them (``return_token_ids``) and the
        derender left them out, as vLLM 0.32's does: a plain server sends them."""
        chat = self.template["chat_request"]
        if not (chat.get("return_token_ids") and isinstance(answer, dict)):
            return answer
        if answer.get("prompt_token_ids") is not None:
            return answer
        return {**answer, "prompt_token_ids": self.template["prompt_token_ids"]}

    def chunk(self, chunk: Any, state: Any) -> dict[str, Any]:
        """The derender request for one streamed generate chunk, with the state the last
        call returned (``None`` first)."""
        return {**self.template, "stream": True, "generate_chunk": chunk, "stream_state": state}

"""An OpenAI-compatible request body, as the policy sees it.

The proxy does not process media: the prefill worker does. Before prefill the
policy sees a request whose batches hold only the media's identities (one
batch per modality, in order of appearance), ``n``, and the caller's salt; it
decides the decode form on that. For a model that uses M-RoPE, image and video
batches also name their grid (a descriptor: the proxy has no values), so a
language-model-only worker that cannot take it is refused before prefill.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

import attrs

from pd_policy import (
    MROPE_GRID_KEYS,
    MalformedRequest,
    Modality,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
    has_mrope_grids,
    needs_encode_leg,
)
from pd_policy_vllm.openai.media.identity import WorkerMedia, part_identities
from pd_policy_vllm.openai.media.parts import MediaPart, media_parts

__all__ = [
    "CACHE_SALT_LIMIT",
    "Route",
    "as_decided",
    "check_cache_salt",
    "policy_request",
    "runs_epd",
]

#: vLLM's limit on ``cache_salt`` (``validate_cache_salt``): characters, and forbidden ones.
CACHE_SALT_LIMIT: Final = 128
_FORBIDDEN_IN_SALT: Final = frozenset("@/\\\x00")
_GRIDS: Final = {Modality.IMAGE: "image_grid_thw", Modality.VIDEO: "video_grid_thw"}


class Route(enum.Enum):
    """The OpenAI endpoints the proxy serves in P/D."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"


def check_cache_salt(salt: object) -> str | None:
    """The caller's ``cache_salt``, if vLLM would take it; ``None`` when absent.

    vLLM refuses an empty salt, one over 128 characters, and one holding ``@``,
    ``/``, ``\\`` or NUL. Refusing it here, before prefill, keeps a prefill
    from running for a decode that cannot. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] (``param="cache_salt"``), whose message
    does not echo the salt.
    """
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise MalformedRequest("cache_salt must be a non-empty string", param="cache_salt")
    if len(salt) > CACHE_SALT_LIMIT or _FORBIDDEN_IN_SALT & set(salt):
        raise MalformedRequest(
            f"cache_salt must be at most {CACHE_SALT_LIMIT} characters and hold none of "
            "'@', '/', '\\\\' or NUL",
            param="cache_salt",
        )
    return salt


def _n(body: Mapping[str, Any]) -> int:
    n = body.get("n", 1)
    if n is None:
        return 1
    if type(n) is not int or n < 1:
        raise MalformedRequest("n must be a positive integer", param="n")
    return n


def _batches(
    parts: tuple[MediaPart, ...], identities: tuple[str, ...], mrope: bool
) -> list[MultimodalBatch]:
    by_modality: dict[Modality, list[str]] = {}
    for part, identity in zip(parts, identities, strict=True):
        by_modality.setdefault(part.modality, []).append(identity)
    batches = []
    for modality, items in by_modality.items():
        tensors: tuple[TensorDescriptor, ...] = ()
        if mrope and modality in _GRIDS:
            rows = (len(items), 3)
            tensors = (TensorDescriptor(_GRIDS[modality], rows, "int64", PayloadLocation.NONE),)
        batches.append(MultimodalBatch(modality=modality, tensors=tensors, mm_hashes=items))
    return batches


def policy_request(
    body: Mapping[str, Any],
    route: Route,
    *,
    request_id: str,
    mrope: bool,
    media: WorkerMedia | None = None,
    nonce: str | None = None,
) -> Request:
    """The core request for an OpenAI ``body`` sent to ``route``.

    ``mrope``: the served model's positions are M-RoPE. ``media``: what the prefill worker
    does with media (its rules and settings; vLLM's defaults when ``None``): each media
    part's identity is the core's
    ([`part_identities`][pd_policy_vllm.openai.media.identity.part_identities], which ``nonce``
    makes pure for an uncached part). Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] (a 400 naming the field) for a body
    that is not an object; a chat body whose messages are not a list of
    objects or hold a part that is neither text nor media; a completions body
    whose ``prompt`` is not one prompt (text or token ids); ``n`` that is not
    a positive integer; a ``cache_salt`` vLLM would refuse; processing options that are
    not objects; and [`MediaRefused`][pd_policy.media_errors.MediaRefused] for a media
    URL the worker would not read.
    """
    if not isinstance(body, Mapping):
        raise MalformedRequest("the body must be a JSON object", param="body")
    salt = check_cache_salt(body.get("cache_salt"))
    n = _n(body)
    if route is Route.COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return Request(request_id, text=prompt, n=n, cache_salt=salt)
        if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            return Request(request_id, input_ids=prompt, n=n, cache_salt=salt)
        raise MalformedRequest(
            "prompt must be one prompt: a string or a list of token ids", param="prompt"
        )
    media = media if media is not None else WorkerMedia()
    parts = media_parts(body, media.rules)
    identities = part_identities(body, parts, media, nonce=nonce)
    batches = _batches(parts, identities, mrope)
    return Request(request_id, text="", batches=batches, n=n, cache_salt=salt)


def _as_rendered(request: Request) -> Request:
    # The request as the render will return it: ids, a placeholder per item and inline
    # grids. Only its shape matters here, so the ids are zeros: it decides the form and
    # the worker exactly as the rendered request will, before any worker is called.
    batches, offset = [], 0
    for batch in request.batches:
        count = len(batch.mm_hashes)
        places = [PlaceholderRange(offset + i, 1) for i in range(count)]
        offset += count
        tensors = tuple(
            attrs.evolve(t, location=PayloadLocation.INLINE) if t.name in MROPE_GRID_KEYS else t
            for t in batch.tensors
        )
        batches.append(attrs.evolve(batch, placeholders=places, tensors=tensors))
    return request.derive(input_ids=(0,) * max(offset, 1), text=None, batches=batches)


def runs_epd(request: Request, route: Route, *, encodes: bool) -> bool:
    """Whether ``request`` runs E/P/D when an encoder is configured (``encodes``): a chat
    request with media and one sample."""
    return encodes and route is Route.CHAT and request.n <= 1 and needs_encode_leg(request)


def as_decided(request: Request, route: Route, *, renders: bool) -> Request:
    """The request the decision is made on: as a render will return it, for an M-RoPE
    chat request whose worker ``renders`` first (the metadata path, E/P/D); else itself.
    A router that chooses the decode worker before planning decides on this."""
    if renders and route is Route.CHAT and has_mrope_grids(request):
        return _as_rendered(request)
    return request

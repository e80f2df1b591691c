"""Each media part's identity, by the core's rule, from a chat body and its prefill worker.

The identity of a part ([`pd_policy.item_identity`][pd_policy.media.identity.item_identity]):

- inline data (a ``data:`` URL, ``input_audio``, embeddings) is hashed: the SHA-256 of
  the URL's text, or of the canonical JSON of the part's data;
- a part with a ``uuid`` is the client's name for it, as vLLM takes it (scoped to the
  client's tenant by then: [`tenant`][pd_policy_vllm.openai.media.tenant]);
- a remote or local URL the proxy has not fetched has no reusable identity: a value
  drawn for the request (``nonce``), so that its decode leg shares no cache with any
  other request's. [`pin`][pd_policy_vllm.http.media.fetch] fetches remote items once and sends
  their bytes to every leg, which makes them inline;

and every identity covers the hash factors: the request's ``mm_processor_kwargs`` and
``media_io_kwargs`` (for the part's modality), and the prefill worker's own
([`WorkerMedia`][pd_policy_vllm.openai.media.identity.WorkerMedia]).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

import attrs

from pd_policy import (
    HashFactors,
    IdentityBasis,
    MalformedRequest,
    MediaFetchRules,
    MediaSource,
    Modality,
    identity_basis,
    item_identity,
)
from pd_policy_vllm.openai.media.parts import MediaPart, media_parts
from pd_policy_vllm.openai.wire.codec import sha256_identity
from pd_policy_vllm.openai.wire.data_url import DataUrl

__all__ = ["WorkerMedia", "part_basis", "part_identities", "request_factors", "uncached_parts"]


def _objects(value: object, param: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedRequest(f"{param} must be an object", param=param)
    return dict(value)


@attrs.frozen(slots=True)
class WorkerMedia:
    """What a prefill worker does with media: the rules it fetches by, and its own
    processing settings (``--mm-processor-kwargs``, and ``--media-io-kwargs`` by
    modality), which are hash factors of every item it processes."""

    rules: MediaFetchRules = attrs.field(factory=MediaFetchRules)
    processor_kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    media_io_kwargs: Mapping[str, Any] = attrs.field(factory=dict)

    def factors(
        self, modality: Modality, request: tuple[dict[str, Any], dict[str, Any]]
    ) -> HashFactors:
        """The hash factors of a ``modality`` item of a request whose own factors are
        ``request`` ([`request_factors`][pd_policy_vllm.openai.media.identity.request_factors])."""
        processor, media_io = request
        return HashFactors(
            processor,
            _objects(media_io.get(modality.value), "media_io_kwargs"),
            self.processor_kwargs,
            _objects(self.media_io_kwargs.get(modality.value), "worker media_io_kwargs"),
        )


def request_factors(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A chat body's own hash factors: its ``mm_processor_kwargs`` and ``media_io_kwargs``.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400, naming the field)
    for either when it is not an object (vLLM would refuse it too)."""
    return (
        _objects(body.get("mm_processor_kwargs"), "mm_processor_kwargs"),
        _objects(body.get("media_io_kwargs"), "media_io_kwargs"),
    )


def _content_digest(part: MediaPart) -> str:
    # A data URL's text is its bytes, base64-encoded: hashed as it is, with no decode;
    # one left in the body is hashed there, the same bytes. A large item was hashed
    # before, off the event loop ([`digests`][pd_policy_vllm.openai.media.digests]):
    # its digest is on the item itself.
    if isinstance(part.url, DataUrl):
        return part.url.sha256()
    if part.url is not None:
        return hashlib.sha256(part.url.encode("utf-8", "surrogatepass")).hexdigest()
    return sha256_identity(part.data)


def part_basis(part: MediaPart, *, fetches: bool = False, renders: bool = False) -> IdentityBasis:
    """The basis of ``part``'s identity on a path where the proxy ``fetches`` remote items
    itself ([`pin`][pd_policy_vllm.http.media.fetch]) and where a worker ``renders`` the request
    first (the metadata path and E/P/D: the worker that fetched an item names it)."""
    pinned = fetches and part.source is MediaSource.REMOTE and part.uuid is None
    return identity_basis(
        part.source, has_uuid=part.uuid is not None, pinned=pinned, worker_hashes=renders
    )


def part_identities(
    body: Mapping[str, Any],
    parts: tuple[MediaPart, ...],
    media: WorkerMedia,
    *,
    nonce: str | None = None,
) -> tuple[str, ...]:
    """The identity of each of ``parts`` (``body``'s, from
    [`media_parts`][pd_policy_vllm.openai.media.parts.media_parts]), in order.

    ``nonce`` is the value an uncached item's identity is made unique with; ``None``
    draws a fresh one (give one to make this pure). Raises as
    [`request_factors`][pd_policy_vllm.openai.media.identity.request_factors] does.
    """
    request = request_factors(body)
    out = []
    for index, part in enumerate(parts):
        factors = media.factors(part.modality, request)
        # A remote item the proxy fetched arrives here inline: its basis is its bytes.
        basis = part_basis(part)
        if basis is IdentityBasis.CLIENT:
            assert part.uuid is not None
            value = part.uuid
        elif basis is IdentityBasis.CONTENT:
            value = _content_digest(part)
        else:  # a URL the proxy did not fetch: unique to this request
            if nonce is None:
                nonce = secrets.token_hex(16)
            value = f"{nonce}/{index}"
        out.append(item_identity(part.modality, basis, value, factors))
    return tuple(out)


def uncached_parts(body: Mapping[str, Any], rules: MediaFetchRules) -> bool:
    """Whether any media part of ``body`` is a URL the proxy has not fetched and the client
    did not name: its identity is then unique to the request."""
    unread = (MediaSource.REMOTE, MediaSource.LOCAL)
    return any(p.source in unread and p.uuid is None for p in media_parts(body, rules))

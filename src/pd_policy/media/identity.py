"""A media item's identity: what it must cover, and when two items are the same.

A stripped decode leg carries no media, so the decode worker's prefix cache
tells two items apart only by the identities folded into its ``cache_salt``
([`fold_salt`][pd_policy.salt.fold_salt]). An identity is therefore a promise:
two items with one identity make the engine compute the same thing. So it covers

* the bytes the engine sees, never a name for them: one URL can serve new content
  (a camera's ``latest.jpg``, a re-signed object-store URL);
* everything else that changes what the engine computes from those bytes: the
  modality, the request's ``mm_processor_kwargs`` and the worker's own processor
  and media settings. vLLM hashes these *hash factors* into its own item hash
  (``multimodal/processing/inputs.py``), so an identity without them would merge
  what the engine keeps apart.

Where the router does not see the bytes, it has three honest answers, the
identity's [`IdentityBasis`][pd_policy.media.identity.IdentityBasis]: the worker that
fetched the item names it (vLLM's own hash, from its render route); the client
named it (a ``uuid``, which vLLM takes as the item's hash, so the decode leg must
agree with the prefill's); or the item is *uncached*: its identity is unique to the
request, so it is correct and merely never reused.
[`identity_basis`][pd_policy.media.identity.identity_basis] is that rule, and
[`item_identity`][pd_policy.media.identity.item_identity] the identity.
"""

from __future__ import annotations

import enum
import hashlib
import json
import operator
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ..batch import Modality
from ..errors import MalformedRequest
from ..fields import instance_of

__all__ = [
    "IDENTITY_PREFIX",
    "HashFactors",
    "IdentityBasis",
    "MediaSource",
    "identity_basis",
    "item_identity",
]

#: Prefix of every identity this module makes; a change of encoding gets a new one.
IDENTITY_PREFIX: Final = "pdm1:"
_DOMAIN: Final = b"pd-policy/media-identity/v1\x00"
_MODALITY_TAG: Final = {Modality.IMAGE: b"I", Modality.AUDIO: b"A", Modality.VIDEO: b"V"}


class MediaSource(enum.Enum):
    """Where an item's bytes are when the router sees the request."""

    #: In the request: a ``data:`` URL, ``input_audio`` data, embeddings.
    INLINE = "inline"
    #: Behind an ``http(s)`` URL, which the worker fetches.
    REMOTE = "remote"
    #: Behind a ``file:`` URL, which the worker reads from its own disk.
    LOCAL = "local"
    #: Nowhere: the client names an item by its ``uuid`` alone, for the worker's cache.
    NAMED = "named"


class IdentityBasis(enum.Enum):
    """What an item's identity is a hash of."""

    #: The bytes the engine sees (the router holds them), and the hash factors.
    CONTENT = "content"
    #: The client's ``uuid``, and the hash factors: vLLM's own rule for a part with one.
    CLIENT = "client"
    #: The hash the worker that fetched the bytes gave them (vLLM's, factors included).
    WORKER = "worker"
    #: Nothing reusable: a value unique to the request, so no other request shares it.
    UNCACHED = "uncached"


def identity_basis(
    source: MediaSource, *, has_uuid: bool, pinned: bool = False, worker_hashes: bool = False
) -> IdentityBasis:
    """The basis of an item's identity: the one rule every adapter follows.

    In this order:

    1. a client ``uuid`` is the identity (vLLM keys the prefill's caches by it, so
       the decode's must agree), whatever the source;
    2. bytes the router holds are hashed: inline bytes, and remote ones it fetched
       once and sends to every leg (``pinned``);
    3. otherwise the worker that fetched them names them, where it says what it
       fetched (``worker_hashes``: the render route returns vLLM's hashes);
    4. otherwise the item is uncached.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a named item with no
    ``uuid`` (it has nothing else), and for ``pinned`` on a source the router cannot
    fetch (only remote bytes are fetched for the worker; local files are the worker's).
    """
    if source is MediaSource.NAMED and not has_uuid:
        raise MalformedRequest("an item without data needs a uuid to name it", param="uuid")
    if pinned and source is not MediaSource.REMOTE:
        raise MalformedRequest(f"only remote items are pinned, not {source.value} ones", "source")
    if has_uuid:
        return IdentityBasis.CLIENT
    if source is MediaSource.INLINE or pinned:
        return IdentityBasis.CONTENT
    if worker_hashes:
        return IdentityBasis.WORKER
    return IdentityBasis.UNCACHED


def _canonical(value: Any, param: str) -> str:
    # Sorted keys, no whitespace: two spellings of one mapping are one factor. Only JSON
    # values: they are what a request or a worker's configuration can hold.
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError):
        raise MalformedRequest(f"{param} must be a JSON object", param=param) from None


def _factor(value: object, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, Mapping):
        raise MalformedRequest(f"{name} must be a JSON object", param=name)
    return _canonical(dict(value), name) if value else ""


def _request_processor_kwargs(value: object) -> str:
    return _factor(value, "mm_processor_kwargs")


def _request_media_io_kwargs(value: object) -> str:
    return _factor(value, "media_io_kwargs")


def _worker_processor_kwargs(value: object) -> str:
    return _factor(value, "worker mm_processor_kwargs")


def _worker_media_io_kwargs(value: object) -> str:
    return _factor(value, "worker media_io_kwargs")


@attrs.frozen(slots=True)
class HashFactors:
    """What, besides an item's bytes, changes what the engine computes from it.

    Each is given as a mapping (or ``None``) and held as its canonical JSON text
    (sorted keys, no whitespace; ``""`` for none), so two spellings of one mapping
    are one factor. An empty mapping and ``None`` are the same factor.

    - ``processor_kwargs``: the request's ``mm_processor_kwargs``;
    - ``media_io_kwargs``: the request's ``media_io_kwargs`` for the item's modality (how
      the worker decodes the bytes: a video's frame count, say);
    - ``worker_processor_kwargs`` and ``worker_media_io_kwargs``: the worker's own
      ``--mm-processor-kwargs`` and ``--media-io-kwargs`` (for the modality). vLLM
      merges the worker's media settings into its hash and leaves its processor
      settings out; both count here, since an identity may split what vLLM merges but
      never merge what it splits.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (``param`` naming the
    factor) for a value that is not a JSON object.
    """

    processor_kwargs: str = attrs.field(default=None, converter=_request_processor_kwargs)
    media_io_kwargs: str = attrs.field(default=None, converter=_request_media_io_kwargs)
    worker_processor_kwargs: str = attrs.field(default=None, converter=_worker_processor_kwargs)
    worker_media_io_kwargs: str = attrs.field(default=None, converter=_worker_media_io_kwargs)


#: Every factor, in the fields' order (attrs.astuple copies recursively, and this runs
#: once per media item of every request); read from the class, so a new factor counts.
_factor_values: Callable[[HashFactors], tuple[str, ...]] = operator.attrgetter(
    *(a.name for a in attrs.fields(HashFactors))
)


def _field(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(8, "big") + raw


def _check_value(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise MalformedRequest("an identity needs a non-empty value", param="value")
    return value


@attrs.frozen(slots=True)
class _Inputs:
    modality: Modality = attrs.field(validator=instance_of(Modality))
    basis: IdentityBasis = attrs.field(validator=instance_of(IdentityBasis))
    value: str = attrs.field(converter=_check_value)
    factors: HashFactors = attrs.field(validator=instance_of(HashFactors))


def item_identity(
    modality: Modality, basis: IdentityBasis, value: str, factors: HashFactors | None = None
) -> str:
    """The identity of one item: ``"pdm1:"`` and 64 hex digits.

    ``value`` is what ``basis`` says: the hex digest of the bytes (``CONTENT``), the
    client's ``uuid`` (``CLIENT``), the worker's hash (``WORKER``) or a value unique
    to the request (``UNCACHED``; the caller draws it, so this stays pure). Two items
    have one identity exactly when their modality, basis, value and every hash factor
    are equal: the SHA-256 is over a length-prefixed encoding of each, so no byte
    inside a value can forge a boundary.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for an empty or
    non-string ``value``, or a ``modality``, ``basis`` or ``factors`` of another type.
    """
    inputs = _Inputs(modality, basis, value, factors if factors is not None else HashFactors())
    h = hashlib.sha256(_DOMAIN)
    h.update(_MODALITY_TAG[inputs.modality])
    h.update(_field(inputs.basis.value))
    h.update(_field(inputs.value))
    for factor in _factor_values(inputs.factors):
        h.update(_field(factor))
    return IDENTITY_PREFIX + h.hexdigest()

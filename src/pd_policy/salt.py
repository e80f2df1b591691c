"""The cache-salt fold: media identity into vLLM's ``cache_salt``.

A stripped decode leg has no multimodal features, so vLLM hashes its prefix
blocks on token ids alone, and two same-size images expand to the same ids.
Folding the per-item content hashes into the salt keeps them apart; the same
image still hits the cache.

Beyond upstream SMG (which *replaces* the salt with ``"mm:" + ",".join(hashes)``),
the fold here:

* combines with the caller's own salt, so tenant isolation survives P/D;
* includes each item's modality and is order-sensitive;
* is unambiguous: it hashes a length-prefixed encoding, so no comma, colon or
  other byte inside a hash or salt can make two different inputs fold equal;
* has a bounded length (``mm1:`` and 64 hex digits) however many images;
* is versioned by its prefix.

[`upstream_cache_salt`][pd_policy.salt.upstream_cache_salt] gives SMG's exact format, for parity
with its servicers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Final

from .batch import Modality
from .request import Request

__all__ = [
    "SALT_FOLD_PREFIX",
    "SALT_FOLD_VERSION",
    "decode_cache_salt",
    "fold_cache_salt",
    "fold_salt",
    "mm_identities",
    "upstream_cache_salt",
    "upstream_decode_cache_salt",
]

#: Version of the fold's encoding; a change of encoding gets a new version and prefix.
SALT_FOLD_VERSION: Final = 1
#: Prefix of every folded salt.
SALT_FOLD_PREFIX: Final = f"mm{SALT_FOLD_VERSION}:"

_DOMAIN: Final = b"pd-policy/cache-salt/v1\x00"
_MODALITY_TAG: Final = {Modality.IMAGE: b"I", Modality.AUDIO: b"A", Modality.VIDEO: b"V"}


def _field(text: str) -> bytes:
    # surrogatepass: a str may hold lone surrogates, and they must stay distinct too.
    raw = text.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(8, "big") + raw


def mm_identities(request: Request) -> tuple[tuple[Modality, str], ...]:
    """Every item's ``(modality, content hash)``, batches in wire order."""
    return tuple((b.modality, h) for b in request.batches for h in b.mm_hashes)


def fold_salt(
    identities: Iterable[tuple[Modality, str]], caller_salt: str | None = None
) -> str | None:
    """Fold media identities and the caller's salt into one ``cache_salt``.

    With no identities the caller's salt passes through unchanged (``None``
    stays ``None``). Otherwise the result is ``"mm1:"`` and the SHA-256 of an
    injective, length-prefixed encoding of the salt and each ``(modality, hash)``.
    """
    items = tuple(identities)
    if not items:
        return caller_salt
    h = hashlib.sha256(_DOMAIN)
    h.update(b"-" if caller_salt is None else b"+" + _field(caller_salt))
    h.update(len(items).to_bytes(8, "big"))
    for modality, digest in items:
        h.update(_MODALITY_TAG[modality] + _field(digest))
    return SALT_FOLD_PREFIX + h.hexdigest()


def fold_cache_salt(leg: Request) -> str | None:
    """The ``cache_salt`` a decode worker uses for ``leg``: its identities and own salt."""
    return fold_salt(mm_identities(leg), leg.cache_salt)


def upstream_cache_salt(hashes: Iterable[str]) -> str | None:
    """SMG's servicer format, for parity: ``"mm:" + ",".join(hashes)``, or ``None``.

    It drops the caller's salt and modality, and is ambiguous when a hash holds a
    comma; prefer [`fold_salt`][pd_policy.salt.fold_salt].
    """
    items = tuple(hashes)
    return "mm:" + ",".join(items) if items else None


def _payload_free(leg: Request) -> bool:
    return not any(b.carries_payload for b in leg.batches)


def decode_cache_salt(leg: Request) -> str | None:
    """The ``cache_salt`` a decode worker gives a leg it serves.

    A leg whose batches carry no pixels or tensors reaches the engine as a plain
    token prompt, so its identities are folded in
    ([`fold_cache_salt`][pd_policy.salt.fold_cache_salt]). A
    leg with payload is processed as multimodal input, and vLLM puts the item
    hashes into its block keys itself; the caller's salt is kept as is.
    """
    return fold_cache_salt(leg) if _payload_free(leg) else leg.cache_salt


def upstream_decode_cache_salt(leg: Request) -> str | None:
    """What an SMG servicer gives the same leg, for parity: ``"mm:..."`` or nothing.

    The vLLM wire request has no salt field, so the caller's salt never arrives.
    """
    if not _payload_free(leg):
        return None
    return upstream_cache_salt(h for b in leg.batches for h in b.mm_hashes)

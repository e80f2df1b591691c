"""The refusals about media items: an item the worker would not fetch, one that could not be
fetched, and one with no identity to keep it apart from others.

Each names the item by its place in the request (``param``), never by its URL or hash:
URLs carry credentials, and hashes can be guessed back to well-known content.
"""

from __future__ import annotations

from .errors import PolicyError

__all__ = ["MediaFetchFailed", "MediaRefused", "MediaUnreachable", "MissingMediaIdentity"]


class MediaRefused(PolicyError):
    """A media item the worker would refuse to read, refused before any worker is called."""

    code = "pd_media_refused"
    status = 400
    meaning = (
        "A media item's URL is one the worker would refuse to read: a scheme other than "
        "data:, http(s): or file:, a host outside the worker's allowed media domains, or a "
        "local file outside its allowed path (or any local file, when it reads none); or, "
        "when the router fetches it, a host that is not a public address (loopback, "
        "private, link-local, metadata, reserved), checked on every redirect. The router "
        "refuses it before any worker is called, and never fetches it."
    )
    default_message = "the worker would refuse to read this media item"


class MediaFetchFailed(PolicyError):
    """The router fetched a remote item for the worker, and the item's host refused it."""

    code = "pd_media_fetch_failed"
    status = 422
    meaning = (
        "The router fetched a remote media item once, to send the same bytes to every leg, "
        "and its host answered with an error, with more bytes than the worker or the router "
        "takes, or with more redirects than the router follows. vLLM answers the same fetch "
        "with a 422."
    )
    default_message = "the media item could not be fetched"


class MediaUnreachable(PolicyError):
    """The router could not reach a remote item's host in the worker's time limit."""

    code = "pd_media_unreachable"
    status = 504
    meaning = (
        "The router could not fetch a remote media item: its host did not answer within the "
        "worker's time limit for the modality, could not be reached, or failed (5xx). The "
        "host may recover, so a gateway may retry."
    )
    default_message = "the media item's host could not be reached"
    may_retry = True


class MissingMediaIdentity(PolicyError):
    """A batch carries media but no content hashes, and its decode leg would take the KV."""

    code = "pd_decode_missing_media_identity"
    status = 400
    meaning = (
        "A multimodal batch carries media (pixels, tensors or placeholders) but no content "
        "hashes, and the decode leg would take the prefill's KV without the media: with no "
        "identity, the decode worker's prefix cache could serve one item's KV for another's "
        "(an answer about the wrong image, with a 200). Give every item a content hash."
    )
    default_message = (
        "a multimodal batch carries media but no content hashes (mm_hashes); in P/D every "
        "item needs one, so that the decode worker never serves one item's cache for another"
    )

"""The rules a worker applies to the media it fetches, which a router that fetches for it keeps.

A router that fetches a remote item once, to send the same bytes to every leg, acts for
the worker, so it must never fetch what the worker would refuse to. These are vLLM's
rules (``multimodal/media/connector.py``, vLLM 0.32), stated as data so that a router
applies them without I/O:

- ``data:`` URLs are read in place; ``http``/``https`` URLs are fetched, from an allowed
  host when the worker lists any (``--allowed-media-domains``: the hostname must equal
  an entry; no subdomains); ``file:`` URLs are read from the worker's own disk, only
  strictly inside ``--allowed-local-media-path``, and never by a router (it does not
  share the worker's disk);
- a download is capped in bytes (``VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB``, and
  ``VLLM_MAX_AUDIO_CLIP_FILESIZE_MB`` for audio) and in time, per modality
  (``VLLM_IMAGE_FETCH_TIMEOUT`` and its peers).

Every refusal is a typed 400 naming the item (``param``), never its URL: URLs carry
credentials (a signed object-store URL is one).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any, Final
from urllib.parse import unquote, urlsplit

import attrs

from ..batch import Modality
from ..errors import MalformedRequest
from ..fields import instance_of
from ..media_errors import MediaRefused
from .identity import MediaSource

__all__ = ["DEFAULT_FETCH_TIMEOUTS", "MediaFetchRules", "check_media_url", "media_source"]

#: vLLM's default fetch time-outs in seconds (``VLLM_{IMAGE,VIDEO,AUDIO}_FETCH_TIMEOUT``).
DEFAULT_FETCH_TIMEOUTS: Final[Mapping[Modality, float]] = {
    Modality.IMAGE: 5.0,
    Modality.VIDEO: 30.0,
    Modality.AUDIO: 10.0,
}
_MIB: Final = 2**20


def _domains(value: object) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise MalformedRequest("allowed_domains must be a list of host names", "allowed_domains")
    hosts = tuple(value)
    if not all(isinstance(h, str) and h for h in hosts):
        raise MalformedRequest("allowed_domains must be a list of host names", "allowed_domains")
    return frozenset(h.lower() for h in hosts)


def _local_path(value: object) -> str | None:
    # vLLM's "" is "no local files".
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith("/"):
        raise MalformedRequest("allowed_local_path must be an absolute path", "allowed_local_path")
    return posixpath.normpath(value)


def _positive(_inst: object, attr: attrs.Attribute[Any], value: Any) -> None:
    if type(value) is not int or not value > 0:
        raise MalformedRequest(f"{attr.name} must be a positive integer", param=attr.name)


def _timeouts(value: object) -> Mapping[Modality, float]:
    if not isinstance(value, Mapping):
        raise MalformedRequest("timeouts must map each modality to seconds", param="timeouts")
    merged = dict(DEFAULT_FETCH_TIMEOUTS)
    for modality, seconds in value.items():
        if not isinstance(modality, Modality) or type(seconds) not in (int, float):
            raise MalformedRequest("timeouts must map each modality to seconds", "timeouts")
        if not seconds > 0:
            raise MalformedRequest("a time-out must be positive", param="timeouts")
        merged[modality] = float(seconds)
    return merged


@attrs.frozen(slots=True)
class MediaFetchRules:
    """What a worker fetches, and within which limits; vLLM's defaults unless told.

    ``allowed_domains`` empty means any host, as in vLLM. ``allowed_local_path`` is
    the worker's ``--allowed-local-media-path`` (``None``: it reads no local file).
    ``known`` says whether the rules were read from the worker itself (its
    ``/server_info``) or set by the router's operator; a router that knows neither
    must not fetch for the worker, since it cannot tell what the worker would refuse.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] for ill-typed limits.
    """

    allowed_domains: frozenset[str] = attrs.field(default=None, converter=_domains)
    allowed_local_path: str | None = attrs.field(default=None, converter=_local_path)
    allow_redirects: bool = attrs.field(default=True, validator=instance_of(bool))
    max_download_bytes: int = attrs.field(default=256 * _MIB, validator=_positive)
    max_audio_bytes: int = attrs.field(default=25 * _MIB, validator=_positive)
    timeouts: Mapping[Modality, float] = attrs.field(
        factory=lambda: dict(DEFAULT_FETCH_TIMEOUTS), converter=_timeouts
    )
    known: bool = attrs.field(default=False, validator=instance_of(bool))

    def max_bytes(self, modality: Modality) -> int:
        """The most a download of a ``modality`` item may hold."""
        if modality is Modality.AUDIO:
            return min(self.max_download_bytes, self.max_audio_bytes)
        return self.max_download_bytes

    def host_allowed(self, host: str | None) -> bool:
        """Whether the worker would fetch from ``host`` (a URL's host name)."""
        if not self.allowed_domains:
            return True
        return host is not None and host.lower() in self.allowed_domains


def media_source(url: str, *, param: str) -> MediaSource:
    """Where a media URL's bytes are: ``INLINE`` (``data:``), ``REMOTE`` (``http``,
    ``https``) or ``LOCAL`` (``file:``). Raises
    [`MediaRefused`][pd_policy.media_errors.MediaRefused] (400, ``param`` naming the item) for
    any other scheme, or no URL: vLLM refuses them too."""
    if not isinstance(url, str) or not url:
        raise MediaRefused("a media item needs a URL", param=param)
    # find and slice, not partition: partition copies the rest, a whole image for data:.
    colon = url.find(":")
    scheme = url[:colon].lower() if colon >= 0 else ""
    if scheme == "data":
        return MediaSource.INLINE
    if scheme in ("http", "https"):
        return MediaSource.REMOTE
    if scheme == "file":
        return MediaSource.LOCAL
    raise MediaRefused("a media URL must be a data:, http(s): or file: URL", param=param)


def check_media_url(url: str, rules: MediaFetchRules, *, param: str) -> MediaSource:
    """The URL's source, once it is one the worker would read; else a typed refusal.

    Raises [`MediaRefused`][pd_policy.media_errors.MediaRefused] (400, ``param`` naming the
    item, never the URL) for a scheme the worker does not read; a remote URL without a
    host, or whose host is not an allowed domain; a local file when the worker reads
    none, or one outside its allowed path (judged on the path as written: the worker
    resolves symbolic links too, and may still refuse).
    """
    source = media_source(url, param=param)
    if source is MediaSource.INLINE:
        return source
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # a malformed port or IPv6 literal
        raise MediaRefused("the media URL is malformed", param=param) from None
    if source is MediaSource.REMOTE:
        if not host:
            raise MediaRefused("a remote media URL needs a host", param=param)
        if not rules.host_allowed(host):
            raise MediaRefused(
                "the media URL's host is not one of the worker's allowed media domains",
                param=param,
            )
        return source
    if rules.allowed_local_path is None:
        raise MediaRefused(
            "the worker reads no local media files (it has no --allowed-local-media-path)",
            param=param,
        )
    path = posixpath.normpath(unquote(parts.netloc + parts.path))
    root = rules.allowed_local_path
    inside = path.startswith(root.rstrip("/") + "/") and path != root
    if not path.startswith("/") or not inside:
        raise MediaRefused(
            "the local media file is outside the worker's --allowed-local-media-path",
            param=param,
        )
    return source

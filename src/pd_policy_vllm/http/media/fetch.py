"""Remote media, fetched once by the proxy within the worker's limits, and pinned: every leg
gets the same bytes, and the item's identity is their hash.

A remote URL is a name, not content: a camera's ``latest.jpg`` serves new bytes
every second. When the prefill and a decode worker each fetch it, or when the
decode leg's identity is the URL's text, the decode worker can serve one image's
KV for another's, with a 200. So the proxy either fetches the item itself and
sends its bytes, as a ``data:`` URL, to every leg
([`RemoteMedia.FETCH`][pd_policy_vllm.http.media.fetch.RemoteMedia]), or leaves the URL to
the worker and gives the item an identity unique to the request (``UNCACHED``:
correct, and never reused), or refuses it (``REFUSE``).

Fetching, the proxy acts for the worker, so it keeps the worker's rules
([`pd_policy.MediaFetchRules`][pd_policy.media.rules.MediaFetchRules]): its allowed
domains (checked on every redirect too, which vLLM does not: a proxy is a front
door), its size cap and its time-out for the modality. It never reads a local file.
And it fetches from its own place in the network, so it keeps its own limits too
([`MediaLimits`][pd_policy_vllm.http.media.guard.MediaLimits]): public addresses only,
checked where each hop connects ([`media_session`][pd_policy_vllm.http.media.guard.media_session]),
and caps on bytes, redirects and time.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

import attrs

from pd_policy import (
    MediaFetchFailed,
    MediaFetchRules,
    MediaRefused,
    MediaSource,
    MediaUnreachable,
    Modality,
    check_media_url,
)
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.media.address import host_address
from pd_policy_vllm.http.media.guard import MediaLimits, RefusedAddress
from pd_policy_vllm.openai.media.parts import MediaPart, media_parts

__all__ = [
    "PINNED_MEDIA_TYPE",
    "Budget",
    "RemoteMedia",
    "check_hop",
    "fetch_hops",
    "fetch_media",
    "refuse_remote_media",
    "unnamed_remote",
]

#: The media type a pinned item's data URL is given: vLLM reads an image's or an audio
#: clip's bytes whatever the type, and a video's as a file for every type but
#: ``video/jpeg`` (a list of frames), which a fetched file must never be taken for.
PINNED_MEDIA_TYPE: Final = "application/octet-stream"
_REDIRECTS: Final = frozenset({301, 302, 303, 307, 308})
_CHUNK: Final = 2**16
_JOIN_OFF_LOOP: Final = 2**20


class RemoteMedia(enum.Enum):
    """What the proxy does with a remote media URL the client did not name by a ``uuid``."""

    #: Fetch it once, within the worker's limits, and send its bytes to every leg.
    FETCH = "fetch"
    #: Send the URL; the item's identity is unique to the request (never cached on decode).
    UNCACHED = "uncached"
    #: Refuse it (400): the client sends the bytes.
    REFUSE = "refuse"


def unnamed_remote(parts: tuple[MediaPart, ...]) -> list[MediaPart]:
    """The remote parts of ``parts`` the client did not name by a ``uuid``: those the
    proxy fetches."""
    return [p for p in parts if p.source is MediaSource.REMOTE and p.uuid is None]


def refuse_remote_media(body: Mapping[str, Any], rules: MediaFetchRules) -> None:
    """Raise [`MediaRefused`][pd_policy.media_errors.MediaRefused] (400, naming the part)
    for the first remote URL of ``body`` that the client did not name by a ``uuid``."""
    for part in unnamed_remote(media_parts(body, rules)):
        raise MediaRefused(
            "this proxy does not send remote media URLs on: send the media inline, as a data: URL",
            param=part.param,
        )


async def fetch_media(
    session: aiohttp.ClientSession,
    url: str,
    modality: Modality,
    rules: MediaFetchRules,
    *,
    param: str,
    limits: MediaLimits | None = None,
) -> bytes:
    """The bytes behind ``url``, fetched as the worker would, within ``rules`` and the
    proxy's ``limits`` (its defaults unless given), over ``session``: one of
    [`media_session`][pd_policy_vllm.http.media.guard.media_session] with the same
    ``limits``, which refuses private addresses where it connects.

    Raises [`MediaRefused`][pd_policy.media_errors.MediaRefused] (400) for a URL, or a
    redirect, the worker would not read, that carries credentials, or whose host is an
    address the proxy does not fetch from (an IP literal, or a name's every address);
    [`MediaFetchFailed`][pd_policy.media_errors.MediaFetchFailed] (422) for an answer
    that is the client's error (4xx), too many redirects, or more bytes than the worker
    or the proxy takes; [`MediaUnreachable`][pd_policy.media_errors.MediaUnreachable]
    (504, retryable) for a host that does not answer in time, cannot be reached, or
    fails (5xx, 408, 429). Each names the item (``param``), never the URL or an address.
    """
    data, _ = await fetch_hops(session, url, modality, rules, param=param, limits=limits)
    return data


@attrs.define
class Budget:
    """The bytes a request's media fetches may still read, together: ``left``."""

    left: int

    def take(self, count: int, param: str) -> None:
        """Take ``count`` bytes; raise
        [`MediaFetchFailed`][pd_policy.media_errors.MediaFetchFailed] (422) past the
        budget."""
        self.left -= count
        if self.left < 0:
            raise MediaFetchFailed(
                "the media items of this request together are larger than this proxy "
                "fetches for one request: send some of them inline",
                param=param,
            )


async def fetch_hops(
    session: aiohttp.ClientSession,
    url: str,
    modality: Modality,
    rules: MediaFetchRules,
    *,
    param: str,
    limits: MediaLimits | None = None,
    budget: Budget | None = None,
) -> tuple[bytes, tuple[str, ...]]:
    """[`fetch_media`][pd_policy_vllm.http.media.fetch.fetch_media], and the URLs it
    fetched, in order (``url``, then each redirect's), the last the one that answered.
    Reads within ``budget`` too, when given: past it, a 422."""
    limits = limits if limits is not None else MediaLimits()
    limit = min(rules.max_bytes(modality), limits.max_bytes)
    seconds = min(rules.timeouts[modality], limits.timeout)
    timeout = aiohttp.ClientTimeout(total=seconds)
    hops: list[str] = []
    try:
        async with asyncio.timeout(seconds):
            for _ in range(limits.max_redirects + 1):
                _check_hop(url, rules, limits, param)
                hops.append(url)
                async with session.get(url, allow_redirects=False, timeout=timeout) as response:
                    location = response.headers.get("Location")
                    if response.status in _REDIRECTS and location and rules.allow_redirects:
                        url = urljoin(url, location)
                        continue
                    return await _body(response, limit, param, budget), tuple(hops)
    except aiohttp.ClientConnectorError as exc:
        if isinstance(exc.os_error, RefusedAddress):
            raise _not_public(param) from None
        raise _unreachable(param) from None
    except aiohttp.InvalidURL:
        raise MediaRefused("the media URL is malformed", param=param) from None
    except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
        raise _unreachable(param) from None
    raise MediaFetchFailed("the media URL redirected too many times", param=param)


def _not_public(param: str) -> MediaRefused:
    return MediaRefused(
        "the media URL's host is not a public address: this proxy does not fetch from "
        "loopback, private, link-local or reserved addresses",
        param=param,
    )


def _unreachable(param: str) -> MediaUnreachable:
    return MediaUnreachable(
        "the media item's host did not answer within the time limit", param=param
    )


def check_hop(url: str, rules: MediaFetchRules, limits: MediaLimits, param: str) -> None:
    """Raise what a fetch raises before it connects to ``url``, one of its hops: a
    [`MediaRefused`][pd_policy.media_errors.MediaRefused] (400) for a URL the worker
    would not read, one carrying credentials, or an address literal ``limits``
    refuse."""
    _check_hop(url, rules, limits, param)


def _check_hop(url: str, rules: MediaFetchRules, limits: MediaLimits, param: str) -> None:
    # Before any I/O, for a typed refusal: the session refuses the same addresses where
    # it connects, the one check a changing DNS answer cannot pass.
    if check_media_url(url, rules, param=param) is not MediaSource.REMOTE:
        raise MediaRefused("a redirect left http(s)", param=param)
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        # The proxy fetches for every tenant and holds no one's secret: a URL's
        # credentials would be sent on (and aiohttp would send them as Basic auth).
        raise MediaRefused(
            "a media URL carrying credentials is not fetched: send the media inline, as a "
            "data: URL",
            param=param,
        )
    address = host_address(parts.hostname or "")
    if address is not None and limits.refuses(address):
        raise _not_public(param)


async def _body(
    response: aiohttp.ClientResponse, limit: int, param: str, budget: Budget | None
) -> bytes:
    status = response.status
    if status >= 500 or status in (408, 429):
        raise MediaUnreachable(f"the media item's host answered {status}", param=param)
    if status != 200:
        raise MediaFetchFailed(f"the media item's host answered {status}", param=param)
    if response.content_length is not None and response.content_length > limit:
        raise MediaFetchFailed("the media item is larger than the worker takes", param=param)
    if budget is not None and response.content_length is not None:
        budget.take(response.content_length, param)  # before reading a byte of it
        budget = None
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            raise MediaFetchFailed("the media item is larger than the worker takes", param=param)
        if budget is not None:
            budget.take(len(chunk), param)
    # Joined once, a large item in a worker thread (bytes.join copies without the GIL),
    # not grown on the event loop, a copy each time its buffer doubles.
    if size < _JOIN_OFF_LOOP:
        return b"".join(chunks)
    return await asyncio.to_thread(b"".join, chunks)

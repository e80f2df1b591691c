"""Remote media fetched once per client request and pinned: every leg of every attempt gets
the same bytes, and the item's identity is their hash.

A request may be tried on several prefills (``--attempts``). Its remote items are
fetched on the first attempt that needs them, kept for the request
([`Fetches`][pd_policy_vllm.http.media.pinning.Fetches], on its state) and sent to every
later attempt's legs: a retry fetches nothing again, and sees the same content. What
is kept is the request's alone and dies with it; nothing is kept across requests (a URL
is a name, not content: the next request's fetch may read new bytes).

Each prefill's own rules still apply to what was fetched for another: on every attempt
a kept item is checked again against the chosen prefill's rules, as its own fetch would
have been ([`recheck`][pd_policy_vllm.http.media.pinning.recheck]): every URL fetched
(the client's and each redirect's) against its allowed domains, a redirect against
whether it follows any, the bytes against its size cap for the modality. Not its
time-out: the fetch is done.

And a request's fetches together read no more than its budget: items times the
per-item cap could be gigabytes, every leg carries the items inline, as base64, and the
proxy holds them all until the request ends. The budget is three quarters of the body
cap ([`fetch_budget`][pd_policy_vllm.http.media.pinning.fetch_budget]): the items' base64
is then no larger than the largest body a client may send inline.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import Any, Final

import attrs

from pd_policy import MediaFetchFailed, MediaFetchRules, PolicyError
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.media.fetch import (
    PINNED_MEDIA_TYPE,
    Budget,
    check_hop,
    fetch_hops,
    unnamed_remote,
)
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.openai.media.parts import MediaPart, media_parts
from pd_policy_vllm.openai.wire.body import MAX_BODY
from pd_policy_vllm.openai.wire.data_url import DataUrl

__all__ = ["Fetched", "Fetches", "fetch_budget", "pin_remote_media", "recheck"]

#: Bytes base64-encoded at a time, a multiple of 3: the encoder holds the GIL while it
#: runs, so a large item is encoded in pieces the event loop can run between.
_B64_PIECE: Final = 3 * 2**18


def fetch_budget(max_body: int = MAX_BODY) -> int:
    """The bytes one request's fetches may read together, for a body cap of ``max_body``
    bytes: three quarters of it, so that their base64 is no larger."""
    return max_body * 3 // 4


@attrs.frozen(slots=True)
class Fetched:
    """One item fetched for a request: the client's ``url``, every URL fetched (``hops``:
    ``url``, then each redirect's), how many bytes it read (``size``), and its bytes as a
    ``data:`` URL, hashed (``pinned``)."""

    url: str
    hops: tuple[str, ...]
    size: int
    pinned: DataUrl = attrs.field(repr=False)


@attrs.define
class Fetches:
    """What one client request fetched, kept for its attempts: each item by its message
    and part, the bytes its fetches may still read (``budget``), and whom to tell how
    each fetch ended (``fetched``)."""

    budget: Budget = attrs.field(factory=lambda: Budget(fetch_budget()))
    items: dict[tuple[int, int], Fetched] = attrs.field(factory=dict)
    #: Told each fetch's end: ``ok``, or the error code it failed with.
    fetched: Callable[[str], None] | None = None


def recheck(fetched: Fetched, part: MediaPart, rules: MediaFetchRules, limits: MediaLimits) -> None:
    """Raise what a fetch of ``part`` within ``rules`` (another prefill's) and ``limits``
    would have raised for what ``fetched`` read: a
    [`MediaRefused`][pd_policy.media_errors.MediaRefused] (400) for a URL fetched that
    ``rules`` do not allow, a
    [`MediaFetchFailed`][pd_policy.media_errors.MediaFetchFailed] (422) for a redirect
    a worker that follows none would not take, or bytes past its cap."""
    for hop in fetched.hops:
        check_hop(hop, rules, limits, part.param)
    if len(fetched.hops) > 1 and not rules.allow_redirects:
        raise MediaFetchFailed("the media URL redirects, and the worker follows none", part.param)
    if fetched.size > min(rules.max_bytes(part.modality), limits.max_bytes):
        raise MediaFetchFailed("the media item is larger than the worker takes", part.param)


def _pinned_url(data: bytes) -> DataUrl:
    # In a worker thread: the encoding in pieces, the hash with the GIL released.
    view = memoryview(data)
    pieces = [f'"data:{PINNED_MEDIA_TYPE};base64,'.encode()]
    for at in range(0, len(data), _B64_PIECE):
        pieces.append(base64.b64encode(view[at : at + _B64_PIECE]))
    pieces.append(b'"')
    raw = b"".join(pieces)
    url = DataUrl(raw, 1, len(raw) - 1)
    url.sha256()
    return url


async def _fetch(
    session: aiohttp.ClientSession,
    part: MediaPart,
    rules: MediaFetchRules,
    limits: MediaLimits,
    fetches: Fetches,
) -> None:
    url = str(part.url)
    try:
        data, hops = await fetch_hops(
            session, url, part.modality, rules, param=part.param, limits=limits,
            budget=fetches.budget,
        )  # fmt: skip
    except PolicyError as exc:
        if fetches.fetched is not None:
            fetches.fetched(exc.code)
        raise
    if fetches.fetched is not None:
        fetches.fetched("ok")
    pinned = await asyncio.to_thread(_pinned_url, data)
    fetches.items[part.message, part.part] = Fetched(url, hops, len(data), pinned)


async def _all(calls: Iterable[Coroutine[Any, Any, None]]) -> None:
    # Concurrently; the first failure cancels the rest (no fetch outlives its request).
    tasks = [asyncio.ensure_future(call) for call in calls]
    try:
        for task in asyncio.as_completed(tasks):
            await task
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def pin_remote_media(
    session: aiohttp.ClientSession,
    body: Mapping[str, Any],
    rules: MediaFetchRules,
    limits: MediaLimits | None = None,
    fetches: Fetches | None = None,
) -> dict[str, Any]:
    """``body`` with each remote URL the client did not name replaced by a ``data:`` URL of
    its bytes, within ``rules`` and ``limits``: an item ``fetches`` (the request's, kept
    across its attempts) holds already is [rechecked][pd_policy_vllm.http.media.pinning.recheck]
    against ``rules``, any other fetched, concurrently
    ([`fetch_hops`][pd_policy_vllm.http.media.fetch.fetch_hops]) within its budget, and
    kept; every other field as it was (``body`` is not changed). Raises what ``recheck``
    and ``fetch_media`` raise, for the first item that fails (the others' fetches are
    cancelled), and a [`MediaFetchFailed`][pd_policy.media_errors.MediaFetchFailed]
    (422) past the budget."""
    limits = limits if limits is not None else MediaLimits()
    fetches = fetches if fetches is not None else Fetches()
    remote = unnamed_remote(media_parts(body, rules))
    if not remote:
        return dict(body)
    missing = []
    for part in remote:
        kept = fetches.items.get((part.message, part.part))
        if kept is not None and kept.url == part.url:
            recheck(kept, part, rules, limits)
        else:
            missing.append(part)
    await _all(_fetch(session, part, rules, limits, fetches) for part in missing)
    messages = list(body["messages"])
    for part in remote:
        message = messages[part.message] = dict(messages[part.message])
        content = message["content"] = list(message["content"])
        pinned = fetches.items[part.message, part.part].pinned
        content[part.part] = _pinned_part(content[part.part], part.key, pinned)
    return {**body, "messages": messages}


def _pinned_part(part: Mapping[str, Any], key: str, url: DataUrl) -> dict[str, Any]:
    value = part[key]
    return {**part, key: {**value, "url": url} if isinstance(value, Mapping) else url}

"""Media in an OpenAI chat body: which parts are media, where their bytes are, and the body
without them.

vLLM's chat renderer treats a content part as media when its ``type`` is not
one of the text types, or when it carries a media key whatever its type
(``renderers/chat_utils.py``: ``has_non_text_content``). A stripped decode leg
must keep *no* such part: vLLM ignores the forwarded prompt ids of a chat
request with any non-text part, and renders the stripped messages instead, an
image-blind prompt answered with HTTP 200. So the test here is the same as
vLLM's, and a part this module cannot place is refused, never left in.

Each media part is read as vLLM reads it: a part with a ``uuid`` is placed by the
media key it carries (vLLM then ignores its ``type``), any other by its ``type``;
its data is a URL (``image_url``, ``audio_url``, ``video_url``, ``input_image``),
inline data (``input_audio``, the ``*_embeds`` and ``image_pil`` parts), or nothing
(a part that names a cached item by its ``uuid`` alone). What identifies it is the
core's rule ([`identity`][pd_policy_vllm.openai.media.identity]).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import attrs

from pd_policy import MalformedRequest, MediaFetchRules, MediaSource, Modality, check_media_url
from pd_policy_vllm.openai.wire.data_url import DataUrl

__all__ = [
    "TEXT_PART_TYPES",
    "MediaPart",
    "count_media_items",
    "count_parts",
    "item_values",
    "media_parts",
    "without_media",
]

#: Content part types vLLM renders as text (``TEXT_PART_TYPES`` and ``tool_reference``).
TEXT_PART_TYPES: Final = frozenset(
    {"text", "input_text", "output_text", "refusal", "thinking", "tool_reference"}
)

#: Media part types and their modality (vLLM's ``MM_PARSER_MAP``, ``prompt_embeds`` aside).
_MEDIA_TYPES: Final[Mapping[str, Modality]] = {
    "image_url": Modality.IMAGE,
    "input_image": Modality.IMAGE,
    "image_embeds": Modality.IMAGE,
    "image_pil": Modality.IMAGE,
    "audio_url": Modality.AUDIO,
    "input_audio": Modality.AUDIO,
    "audio_embeds": Modality.AUDIO,
    "video_url": Modality.VIDEO,
    "video_embeds": Modality.VIDEO,
}
_MEDIA_KEYS: Final = frozenset(_MEDIA_TYPES) | {"prompt_embeds"}
#: The media keys in the order vLLM looks for them in a part with a ``uuid``.
_UUID_KEY_ORDER: Final = (
    "image_url",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "video_embeds",
    "audio_url",
    "input_audio",
    "video_url",
)
#: Part types whose data is a URL, and the key that holds it (``input_image``'s own key
#: is ``image_url``).
_URL_KEYS: Final = {
    "image_url": "image_url",
    "input_image": "image_url",
    "audio_url": "audio_url",
    "video_url": "video_url",
}


@attrs.frozen(slots=True)
class MediaPart:
    """One media item of a chat body: where it is, what it is, and where its bytes are.

    ``key`` is the part's key that holds its data (``image_url`` for an ``input_image``
    too, ``input_audio``...); ``url`` its URL (a
    [`DataUrl`][pd_policy_vllm.openai.wire.data_url.DataUrl] when the body was
    [skimmed][pd_policy_vllm.openai.wire.skim.skim]) for a part whose data is one (``source``
    then says where the URL points);
    ``data`` the part's inline data otherwise (``None`` for a part named by its
    ``uuid`` alone). ``uuid`` is the client's, as vLLM reads it (``str(uuid)``).
    """

    message: int
    part: int
    modality: Modality
    key: str
    source: MediaSource
    url: str | DataUrl | None = attrs.field(default=None, repr=False)
    data: Any = attrs.field(default=None, repr=False)
    uuid: str | None = attrs.field(default=None, repr=False)

    @property
    def param(self) -> str:
        """Where the part is, as an error's ``param`` names it."""
        return f"messages[{self.message}].content[{self.part}]"


def _is_text(part: Mapping[str, Any]) -> bool:
    kind = part.get("type", "text")
    return isinstance(kind, str) and kind in TEXT_PART_TYPES and not (_MEDIA_KEYS & set(part))


def _key(part: Mapping[str, Any], where: str) -> str:
    if part.get("uuid") is not None:
        for key in _UUID_KEY_ORDER:
            if key in part:
                return key
    kind = part.get("type")
    if isinstance(kind, str) and kind in _MEDIA_TYPES:
        return kind
    keys = sorted(k for k in _MEDIA_TYPES if k in part)
    if kind is None and len(keys) == 1:
        return keys[0]
    raise MalformedRequest(
        "a content part this proxy cannot place as text or as one kind of media", param=where
    )


def _url(value: Any, where: str) -> str | DataUrl | None:
    # {"url": ...} or the URL itself (vLLM's simple form); None names a cached item.
    if isinstance(value, Mapping):
        value = value.get("url")
    if value is None or isinstance(value, str | DataUrl):
        return value or None
    raise MalformedRequest("a media part's URL must be a string", param=where)


def _read(m: int, p: int, part: Mapping[str, Any], rules: MediaFetchRules) -> MediaPart:
    where = f"messages[{m}].content[{p}]"
    key = _key(part, where)
    modality = _MEDIA_TYPES[key]
    raw_uuid = part.get("uuid")
    uuid = None if raw_uuid is None else str(raw_uuid)
    url_key = _URL_KEYS.get(key)
    value = part.get(url_key if url_key is not None else key)
    if url_key is not None:
        url = _url(value, where)
        if url is not None:
            text = url.head() if isinstance(url, DataUrl) else url  # the scheme is enough
            source = check_media_url(text, rules, param=where)
            return MediaPart(m, p, modality, url_key, source, url=url, uuid=uuid)
        value = None
    if value is None:
        if uuid is None:
            raise MalformedRequest("a media part needs data, or a uuid naming it", param=where)
        return MediaPart(m, p, modality, key, MediaSource.NAMED, uuid=uuid)
    return MediaPart(m, p, modality, key, MediaSource.INLINE, data=value, uuid=uuid)


def _messages(body: Mapping[str, Any]) -> Sequence[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MalformedRequest("messages must be a non-empty list", param="messages")
    return messages


def _media(body: Mapping[str, Any]) -> list[tuple[int, int, dict[str, Any]]]:
    found = []
    for m, message in enumerate(_messages(body)):
        if not isinstance(message, dict):
            raise MalformedRequest("a message must be an object", param=f"messages[{m}]")
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            if not isinstance(part, dict):
                raise MalformedRequest(
                    "a content part must be an object", param=f"messages[{m}].content[{p}]"
                )
            if not _is_text(part):
                found.append((m, p, part))
    return found


#: The members of a body whose items hold content parts: chat's, and the Responses API's.
_ITEMS: Final = ("messages", "input")


def count_parts(body: Any, most: int) -> int:
    """How many items of ``body``'s ``messages`` and ``input``, and content parts of theirs,
    there are together, counted up to ``most`` and no further: a step a message, never a
    part (a content list is counted by its length). Raises nothing: what is not a list of
    items or a content list counts for nothing (the plan refuses it later)."""
    if not isinstance(body, dict):
        return 0
    found = 0
    for field in _ITEMS:
        items = body.get(field)
        if not isinstance(items, list):
            continue
        found += len(items)
        for item in items:
            if found >= most:
                return most
            content = item.get("content") if isinstance(item, dict) else None
            if isinstance(content, list):
                found += len(content)
    return min(found, most)


def count_media_items(body: Any, most: int) -> int:
    """How many content parts of ``body``'s ``messages`` and ``input`` items the proxy
    works on one by one (a media part, or any part carrying a ``uuid``, which is scoped to
    its tenant), counted up to ``most`` and no further: the parts past it are never read.

    Reads no part's value and raises nothing: what is not an object, a list of items, a
    content list or a part is skipped (the plan refuses it later), so that a request can
    be refused for its count before any other work on it
    ([`check_media_items`][pd_policy.request_bounds.check_media_items])."""
    if not isinstance(body, dict):
        return 0
    found = 0
    for field in _ITEMS:
        items = body.get(field)
        for item in items if isinstance(items, list) else ():
            content = item.get("content") if isinstance(item, dict) else None
            for part in content if isinstance(content, list) else ():
                if isinstance(part, dict) and (part.get("uuid") is not None or not _is_text(part)):
                    found += 1
                    if found >= most:
                        return found
    return found


def item_values(body: Mapping[str, Any]) -> Iterator[tuple[int, int, str, Any, bool]]:
    """Each media part of a chat body's ``messages`` that the client did not name by a
    ``uuid`` and that holds a value, in order, read as
    [`media_parts`][pd_policy_vllm.openai.media.parts.media_parts] reads it: its message
    and part, the part's key that holds the value, the value (its URL, or its inline
    data), and whether it is a URL. Raises nothing: what ``media_parts`` would refuse is
    skipped (the plan refuses it)."""
    messages = body.get("messages")
    for m, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, dict) else None
        for p, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or _is_text(part) or part.get("uuid") is not None:
                continue
            try:
                key = _key(part, "")
                url_key = _URL_KEYS.get(key)
                value = part.get(url_key or key)
                url = _url(value, "") if url_key is not None else None
            except MalformedRequest:
                continue
            if url_key is not None and url is not None:
                yield m, p, url_key, url, True
            elif url_key is None and value is not None:
                yield m, p, key, value, False


def media_parts(
    body: Mapping[str, Any], rules: MediaFetchRules | None = None
) -> tuple[MediaPart, ...]:
    """Every media part of a chat body's ``messages``, in order, read as vLLM reads it.

    ``rules`` are the worker's media rules (vLLM's defaults when ``None``): a URL the
    worker would refuse is refused here, before any worker is called. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400, ``param`` naming the
    part) for messages that are not a list of objects, a part that is neither text nor
    one kind of media (``prompt_embeds`` included: a decode leg could not keep it and
    stay text), a URL that is not a string, and a part with neither data nor a
    ``uuid``; [`MediaRefused`][pd_policy.media_errors.MediaRefused] (400) for a URL the
    worker would not read ([`check_media_url`][pd_policy.media.rules.check_media_url]).
    """
    rules = rules if rules is not None else MediaFetchRules()
    return tuple(_read(m, p, part, rules) for m, p, part in _media(body))


def without_media(body: Mapping[str, Any]) -> list[Any]:
    """``messages`` with every media part removed; text parts, roles, tool calls and every
    other field kept. A message whose content were only media keeps an empty string.
    Raises as [`media_parts`][pd_policy_vllm.openai.media.parts.media_parts] does for messages and
    parts it cannot place (it reads no URL)."""
    for m, p, part in _media(body):
        _key(part, f"messages[{m}].content[{p}]")  # refuses what cannot be placed
    out = []
    for message in _messages(body):
        content = message.get("content")
        if isinstance(content, list):
            kept = [part for part in content if _is_text(part)]
            message = {**message, "content": kept if kept else ""}
        out.append(message)
    return out

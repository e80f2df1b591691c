"""Media in an OpenAI chat body: which parts are media, their identities, and the body
without them.

vLLM's chat renderer treats a content part as media when its ``type`` is not
one of the text types, or when it carries a media key whatever its type
(``renderers/chat_utils.py``: ``has_non_text_content``). A stripped decode leg
must keep *no* such part: vLLM ignores the forwarded prompt ids of a chat
request with any non-text part, and renders the stripped messages instead, an
image-blind prompt answered with HTTP 200. So the test here is the same as
vLLM's, and a part this module cannot place is refused, never left in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from pd_policy import MalformedRequest, Modality

from .codec import sha256_identity

__all__ = ["TEXT_PART_TYPES", "MediaPart", "media_parts", "without_media"]

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


@attrs.frozen(slots=True)
class MediaPart:
    """One media item of a chat body: where it is, its modality and its identity.

    The identity is the part's ``uuid`` when the client gave one (vLLM uses it
    as the item's hash too), else the SHA-256 of the part's canonical JSON: a
    data URL's bytes, or a remote URL's text (two fetches of one URL that
    returned different images would share it; give a ``uuid`` then).
    """

    message: int
    part: int
    modality: Modality
    identity: str


def _is_text(part: Mapping[str, Any]) -> bool:
    kind = part.get("type", "text")
    return isinstance(kind, str) and kind in TEXT_PART_TYPES and not (_MEDIA_KEYS & set(part))


def _modality(part: Mapping[str, Any], where: str) -> Modality:
    kind = part.get("type")
    if isinstance(kind, str) and kind in _MEDIA_TYPES:
        return _MEDIA_TYPES[kind]
    keys = sorted(k for k in _MEDIA_TYPES if k in part)
    if kind is None and len(keys) == 1:
        return _MEDIA_TYPES[keys[0]]
    raise MalformedRequest(
        "a content part this proxy cannot place as text or as one kind of media", param=where
    )


def _identity(part: Mapping[str, Any]) -> str:
    uuid = part.get("uuid")
    if uuid is not None:
        return str(uuid)
    return sha256_identity(part)


def _messages(body: Mapping[str, Any]) -> Sequence[Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise MalformedRequest("messages must be a non-empty list", param="messages")
    return messages


def _media(body: Mapping[str, Any]) -> list[tuple[int, int, Modality, dict[str, Any]]]:
    found = []
    for m, message in enumerate(_messages(body)):
        if not isinstance(message, dict):
            raise MalformedRequest("a message must be an object", param=f"messages[{m}]")
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for p, part in enumerate(content):
            where = f"messages[{m}].content[{p}]"
            if not isinstance(part, dict):
                raise MalformedRequest("a content part must be an object", param=where)
            if not _is_text(part):
                found.append((m, p, _modality(part, where), part))
    return found


def media_parts(body: Mapping[str, Any]) -> tuple[MediaPart, ...]:
    """Every media part of a chat body's ``messages``, in order.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400, ``param`` naming the
    part) for messages that are not a list of objects, and for a part that is
    neither text nor one kind of media (``prompt_embeds`` included: a decode
    leg could not keep it and stay text).
    """
    return tuple(MediaPart(m, p, kind, _identity(part)) for m, p, kind, part in _media(body))


def without_media(body: Mapping[str, Any]) -> list[Any]:
    """``messages`` with every media part removed; text parts, roles, tool calls and every
    other field kept. A message whose content were only media keeps an empty string.
    Raises as [`media_parts`][pd_policy_vllm.http.media.media_parts] does."""
    _media(body)  # refuses what cannot be placed
    out = []
    for message in _messages(body):
        content = message.get("content")
        if isinstance(content, list):
            kept = [part for part in content if _is_text(part)]
            message = {**message, "content": kept if kept else ""}
        out.append(message)
    return out

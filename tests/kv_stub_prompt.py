"""The stand-in KV worker's toy tokenizer, and its render answer as vLLM's scale-out render
route writes one.

The stand-in (``tests/kv_stub.py``) must name its prompt's blocks the way a vLLM worker
does, so it needs an expanded prompt: token ids, each image a run of placeholder ids
named by the image's hash. Any deterministic tokenizer does; this one is:

- a chat prompt is ``BOS``, then per message its role's token, its content and
  ``END_OF_TURN``, then the assistant's token (the generation prompt);
- text is split on white space, each word ``WORDS + crc32(word) % VOCABULARY``;
- an ``image_url`` part whose URL is a ``data:`` URL (base64) is ``image_tokens``
  placeholder ids (``IMAGE``), named by the part's ``uuid`` when it has one (as vLLM
  names it), else by the SHA-256 (hex) of the URL's decoded bytes;
- a completions prompt is ``BOS`` and its words, or its token ids as they are;
- a scale-out generate request (a rendered request) is its ids, each item named by its
  hash at its placeholder.

Anything else (a remote URL, another part type, a salt vLLM refuses) is the client's
error: [`PromptError`][kv_stub_prompt.PromptError], a 400.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from pd_policy import MalformedRequest
from pd_policy.cache.kv_blocks import MmSpan
from pd_policy_vllm.openai.plan.request import check_cache_salt

__all__ = [
    "Prompt",
    "PromptError",
    "chat_prompt",
    "completion_prompts",
    "generate_prompt",
    "render_answer",
]

BOS: Final = 1
ROLES: Final = {"system": 2, "user": 3, "assistant": 4, "tool": 5}
END_OF_TURN: Final = 8
IMAGE: Final = 9
WORDS: Final = 100
VOCABULARY: Final = 30_000


class PromptError(ValueError):
    """A body the stand-in cannot read as a prompt (vLLM answers such a body 400)."""


@attrs.frozen(slots=True)
class Prompt:
    """An expanded prompt: its ids, its images' places, and its ``cache_salt``."""

    token_ids: tuple[int, ...]
    items: tuple[MmSpan, ...] = ()
    cache_salt: str | None = None


def _words(text: object) -> list[int]:
    if not isinstance(text, str):
        raise PromptError("a text is not a string")
    return [WORDS + zlib.crc32(word.encode()) % VOCABULARY for word in text.split()]


def _image(part: Mapping[str, Any]) -> tuple[str, bytes]:
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, Mapping) else image
    if not isinstance(url, str) or not url.startswith("data:") or ";base64," not in url:
        raise PromptError("the stand-in reads base64 data: URLs only")
    try:
        data = base64.b64decode(url.partition(";base64,")[2], validate=True)
    except binascii.Error:
        raise PromptError("an image's data is not base64") from None
    name = part.get("uuid")
    return (name if isinstance(name, str) and name else hashlib.sha256(data).hexdigest()), data


def _salt(body: Mapping[str, Any]) -> str | None:
    try:
        return check_cache_salt(body.get("cache_salt"))
    except MalformedRequest as exc:
        raise PromptError(exc.message) from None


def chat_prompt(body: Mapping[str, Any], image_tokens: int) -> tuple[Prompt, list[bytes]]:
    """The prompt of a chat ``body``, each image ``image_tokens`` long, and the images'
    bytes in order. Raises [`PromptError`][kv_stub_prompt.PromptError]."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptError("messages is not a non-empty list")
    ids, items, images = [BOS], [], []
    for message in messages:
        if not isinstance(message, Mapping) or message.get("role") not in ROLES:
            raise PromptError("a message has no known role")
        ids.append(ROLES[message["role"]])
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        elif not isinstance(content, list):
            raise PromptError("a message's content is neither text nor parts")
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "text":
                ids += _words(part.get("text"))
            elif kind == "image_url":
                name, data = _image(part)
                items.append(MmSpan(name, len(ids), image_tokens))
                images.append(data)
                ids += [IMAGE] * image_tokens
            else:
                raise PromptError("a content part is neither text nor image_url")
        ids.append(END_OF_TURN)
    ids.append(ROLES["assistant"])
    return Prompt(tuple(ids), tuple(items), _salt(body)), images


def completion_prompts(body: Mapping[str, Any]) -> list[Prompt]:
    """The prompts of a completions ``body``: one string, a list of strings, or a list of
    token ids. Raises [`PromptError`][kv_stub_prompt.PromptError]."""
    prompt, salt = body.get("prompt"), _salt(body)
    if isinstance(prompt, str):
        return [Prompt((BOS, *_words(prompt)), (), salt)]
    if isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
        return [Prompt(tuple(prompt), (), salt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [Prompt((BOS, *_words(p)), (), salt) for p in prompt]
    raise PromptError("prompt is neither text nor token ids")


def generate_prompt(body: Mapping[str, Any]) -> Prompt:
    """The prompt of a scale-out generate ``body`` (a rendered request): its ids, and each
    item named by its hash at its placeholder. An item without its processed tensors is
    refused: vLLM's generate route would read it as one its cache holds. Raises
    [`PromptError`][kv_stub_prompt.PromptError]."""
    ids = body.get("token_ids")
    if not (isinstance(ids, list) and ids and all(type(t) is int and t >= 0 for t in ids)):
        raise PromptError("token_ids is not a list of token ids")
    features, items = body.get("features"), []
    if features is not None:
        try:
            for modality, names in features["mm_hashes"].items():
                places, tensors = features["mm_placeholders"][modality], features["kwargs_data"]
                if not all(tensors[modality]):
                    raise PromptError("an item has no processed tensors")
                for name, place in zip(names, places, strict=True):
                    items.append(MmSpan(name, place["offset"], place["length"]))
        except PromptError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError):
            raise PromptError("features do not describe the items") from None
    items.sort(key=lambda item: item.offset)
    return Prompt(tuple(ids), tuple(items), _salt(body))


def _features(prompt: Prompt, tensors: Sequence[str | None] | None) -> dict[str, Any] | None:
    if not prompt.items:
        return None
    return {
        "mm_hashes": {"image": [item.identifier for item in prompt.items]},
        "mm_placeholders": {
            "image": [{"offset": item.offset, "length": item.length} for item in prompt.items]
        },
        "kwargs_data": {"image": list(tensors)} if tensors is not None else None,
        "mm_metadata": None,
    }


def render_answer(
    body: Mapping[str, Any], prompt: Prompt, tensors: Sequence[str | None] | None
) -> dict[str, Any]:
    """The ``GenerateRequest`` vLLM's render route answers for ``body`` (its
    ``model_dump()``, every key in its order): the prompt's ids, and its items' hashes,
    placeholders and processed tensors (``tensors``, base64, one per item; ``None`` when
    the body asked for ``mm_payload: "none"``)."""
    sampling = {"stop": [], "stop_token_ids": [], "bad_words": [],
                "skip_reading_prefix_cache": False}  # fmt: skip
    return {
        "request_id": uuid.uuid4().hex[:16],
        "token_ids": list(prompt.token_ids),
        "token_offsets": None,
        "features": _features(prompt, tensors),
        "content_parts": None,
        "sampling_params": sampling,
        "model": body.get("model"),
        "reasoning_ended": None,
        "reasoning_parser_kwargs": None,
        "return_token_ids": None,
        "output_mode": "tokens",
        "stream": bool(body.get("stream")),
        "stream_options": None,
        "cache_salt": prompt.cache_salt,
        "priority": 0,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
    }

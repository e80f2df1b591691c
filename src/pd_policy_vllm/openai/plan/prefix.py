"""A request's prompt as a prefill worker will cache it: what a router hashes into block
names ([`BlockHasher`][pd_policy.cache.kv_blocks.BlockHasher]) to ask which worker holds it.

The worker caches the *expanded* prompt: every media item's placeholder run at its
length, named by the item's content hash. The router processes no media, so it learns
both from a worker: the render route of vLLM's scale-out API
(``--enable-scale-out``) answers with the prompt's ids and each item's hash and
placeholder, for the chat, completions and Responses APIs. A completions request whose
prompt is token ids already is its own prompt, and needs no render.

A render's answer is a worker's input: whatever does not read as a prompt (ids that are
not vocabulary indexes, items that overlap or run past it) is refused here, and the
router routes without a prediction. The salt is the client's ``cache_salt``, which the
prefill leg carries unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import attrs

from pd_policy import MalformedRequest
from pd_policy.cache.kv_blocks import MmSpan
from pd_policy_vllm.openai.plan.request import Route, check_cache_salt
from pd_policy_vllm.openai.wire.codec import token_ids

__all__ = ["RENDERS", "Prompt", "prompt_of_body", "prompt_of_render"]

#: Each route's render route (the scale-out API's).
RENDERS: Final = {
    Route.CHAT: "/v1/chat/completions/render",
    Route.COMPLETIONS: "/v1/completions/render",
}


@attrs.frozen(slots=True)
class Prompt:
    """The expanded prompt a prefill caches: its ``token_ids``, its media ``items`` in
    order, and the ``cache_salt`` its first block is salted with."""

    token_ids: tuple[int, ...]
    items: tuple[MmSpan, ...] = ()
    cache_salt: str | None = None

    def leading(self, most: int) -> Prompt:
        """The prompt's first ``most`` tokens, with the items that begin within them
        (cut where it ends): each of its blocks is named as the whole prompt's is, since
        a block's name holds only the items that begin before its end."""
        if len(self.token_ids) <= most:
            return self
        items = tuple(
            MmSpan(i.identifier, i.offset, min(i.length, most - i.offset))
            for i in self.items
            if i.offset < most
        )
        return Prompt(self.token_ids[:most], items, self.cache_salt)


def prompt_of_body(body: Mapping[str, Any], route: Route) -> Prompt | None:
    """The prompt of a completions ``body`` whose prompt is one list of token ids; ``None``
    for any other body (it needs a render). Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] for a salt vLLM would refuse."""
    if route is not Route.COMPLETIONS:
        return None
    ids = token_ids(body.get("prompt"))
    if ids is None:
        return None
    return Prompt(ids, (), check_cache_salt(body.get("cache_salt")))


def _items(features: Any) -> tuple[MmSpan, ...]:
    if features is None:
        return ()
    if not isinstance(features, Mapping):
        raise MalformedRequest("a render's features are not an object", param="features")
    hashes, places = features.get("mm_hashes") or {}, features.get("mm_placeholders") or {}
    if not isinstance(hashes, Mapping) or not isinstance(places, Mapping):
        raise MalformedRequest("a render's items are not by modality", param="features")
    items = []
    for modality, names in hashes.items():
        ranges = places.get(modality)
        if not isinstance(names, list) or not isinstance(ranges, list):
            raise MalformedRequest("a render's items are not lists", param="features")
        if len(names) != len(ranges):
            raise MalformedRequest("a render's item has no placeholder", param="features")
        for name, where in zip(names, ranges, strict=True):
            if not isinstance(name, str) or not isinstance(where, Mapping):
                raise MalformedRequest("a render's item is not named", param="features")
            offset, length = where.get("offset"), where.get("length")
            if type(offset) is not int or type(length) is not int:
                raise MalformedRequest("a render's placeholder is not a range", "features")
            items.append(MmSpan(name, offset, length))
    return tuple(sorted(items, key=lambda item: item.offset))


def prompt_of_render(answer: Any, body: Mapping[str, Any]) -> Prompt:
    """The prompt of ``body`` from its render's ``answer`` (a completions render answers
    with a list: one prompt only). Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] for an answer that does not
    describe one prompt, or a salt vLLM would refuse (the router then routes without a
    prediction)."""
    if isinstance(answer, list):
        if len(answer) != 1:
            raise MalformedRequest("a render answered more than one prompt", "prompt")
        answer = answer[0]
    if not isinstance(answer, Mapping):
        raise MalformedRequest("a render's answer is not an object", param="token_ids")
    ids = token_ids(answer.get("token_ids"))
    if ids is None:
        raise MalformedRequest("a render's answer has no token ids", param="token_ids")
    items = _items(answer.get("features"))
    end = 0
    for item in items:
        if item.offset < end or item.offset + item.length > len(ids):
            raise MalformedRequest("a render's items overlap or run past it", "features")
        end = item.offset + item.length
    return Prompt(ids, items, check_cache_salt(body.get("cache_salt")))

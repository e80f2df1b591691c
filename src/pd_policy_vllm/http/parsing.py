"""A client's body parsed, and counted before any work on each of its parts.

Once parsed, its messages and content parts are counted by their lists' lengths, and its
media items one by one (both up to their cap and one: the rest is never read); a request
past either cap is refused (400 ``pd_too_many_parts``, ``pd_too_many_media_items``)
before any work on each part or item: its uuids scoped, its chat equivalent made, its
items read, hashed or placed, its parts walked on every attempt. Each of those is Python
on the proxy's one event loop, and a body of 200 000 tiny images, or of 400 000 text
parts, would hold every other client for seconds. A body of
[`OFF_THE_LOOP`][pd_policy_vllm.http.parsing.OFF_THE_LOOP] bytes or more is parsed and
counted in a thread (by the front door), where each of its values costs no one else.
"""

from __future__ import annotations

import gc
from typing import Any, Final

from pd_policy import MalformedRequest, PolicyError
from pd_policy.request_bounds import check_media_items, check_parts
from pd_policy_vllm.openai.media.parts import count_media_items, count_parts
from pd_policy_vllm.openai.wire.codec import loads
from pd_policy_vllm.openai.wire.skim import skim

__all__ = ["OFF_THE_LOOP", "parsed", "streams"]

#: Bytes of a body from which it is parsed and counted in a thread: a body of many small
#: values costs a step of Python each (a walk, the cycle collector), which must not hold
#: the loop; a smaller one is parsed in less time than a thread's hand-off takes.
OFF_THE_LOOP: Final = 2**20


def parsed(raw: bytes, *, skims: bool, max_parts: int, max_media_items: int) -> Any:
    """The client's body ``raw`` parsed (a chat body, ``skims``, with its long data URLs
    left in its bytes) and counted. Raises the parse's refusals (400), and
    [`TooManyParts`][pd_policy.client_errors.TooManyParts] or
    [`TooManyMediaItems`][pd_policy.client_errors.TooManyMediaItems] (400) for more than
    ``max_parts`` messages and parts or ``max_media_items`` media items. Not an object:
    returned as it is (the plan refuses it)."""
    # A parsed body is a tree: nothing for the cycle collector to find. But a body of
    # hundreds of thousands of small objects sets it off again and again while it is
    # built, each pass over every object alive: two thirds of the parse, on the loop.
    # (Inline, not a context manager: this runs once a request.)
    collecting = gc.isenabled()
    gc.disable()
    try:
        body = skim(raw) if skims else loads(raw)
        # Counted before any work on each part or item, the tenant's scoping included.
        try:
            check_parts(count_parts(body, max_parts + 1), max_parts)
            most = max_media_items
            check_media_items(count_media_items(body, most + 1), most)
        except PolicyError:
            del body  # freed now, while the cycle collector is off: it has nothing to find
            raise
        return body
    finally:
        if collecting:
            gc.enable()


def streams(body: Any) -> bool:
    """Whether the parsed ``body`` asks for a stream. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400) for a ``stream`` that is
    not a boolean: vLLM reads ``"false"`` as false, and a proxy that took it for a stream
    would relay a whole answer as events."""
    stream = body.get("stream") if isinstance(body, dict) else None
    if stream is not None and not isinstance(stream, bool):
        raise MalformedRequest("stream must be true or false", param="stream")
    return bool(stream)

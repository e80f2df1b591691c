"""A request's large inline media items, hashed before its plan reads them: the work is
found here, on the event loop (a walk of its parts, no byte of an item read), and done
in a worker thread (SHA-256 releases the GIL over a large buffer), so that one client's
100 MiB image does not hold every other client's requests while it is hashed.

The plan then finds each item's digest on the item itself, and never keeps it anywhere
else: a [`DataUrl`][pd_policy_vllm.openai.wire.data_url.DataUrl] (a data URL left in the
client's bytes, or one the proxy made of a parsed string) memoizes its own, and a
[`Canonical`][pd_policy_vllm.openai.wire.codec.Canonical] holds an inline item's
canonical JSON and its digest. Both are immutable, so a digest is always of the bytes it
sits on: no digest outlives its item, and none can be found for other bytes.

Only the items of a request that together hold at least ``least`` bytes
([`HASH_OFF_LOOP`][pd_policy_vllm.openai.media.digests.HASH_OFF_LOOP]) are hashed so: a
small request is hashed on the loop in less time than a thread's hand-off takes. A
data URL that is not a data URL's text (anything but ASCII without quotes, backslashes
or control characters; vLLM reads none but base64) is refused when it is that large.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from pd_policy import MalformedRequest
from pd_policy_vllm.openai.media.parts import item_values
from pd_policy_vllm.openai.wire.codec import Canonical
from pd_policy_vllm.openai.wire.data_url import DataUrl

__all__ = ["HASH_OFF_LOOP", "hashing"]

#: A request's inline items together hold this many bytes or more: hashed in a thread.
HASH_OFF_LOOP: Final = 2**20
#: The nodes of an inline item's value looked at to size it; past them, it is large.
_SIZED_NODES: Final = 64


@attrs.frozen(slots=True)
class _Item:
    message: int
    part: int
    key: str
    value: Any  # a DataUrl or str (a data URL), or inline data
    url: bool


def _size(value: Any, nodes: list[int]) -> int:
    # The bytes of a value's strings, near enough; a value of many nodes counts as large.
    nodes[0] -= 1
    if nodes[0] < 0:
        return HASH_OFF_LOOP
    if isinstance(value, str | DataUrl):
        return len(value)
    if isinstance(value, Mapping):
        return sum(len(k) + _size(v, nodes) for k, v in value.items() if isinstance(k, str))
    if isinstance(value, list):
        return sum(_size(v, nodes) for v in value)
    return 8


def _items(body: Mapping[str, Any]) -> list[_Item]:
    out = []
    for m, p, key, value, url in item_values(body):
        if url and isinstance(value, str) and value[:5].lower() != "data:":
            continue  # a remote or local URL: its text is not hashed
        if isinstance(value, DataUrl) and value.hashed:
            continue
        out.append(_Item(m, p, key, value, url))
    return out


def _digested(item: _Item) -> Any:
    value = item.value
    if not item.url:
        return Canonical(value)
    url = value if isinstance(value, DataUrl) else DataUrl.of(value)
    if url is None:
        raise MalformedRequest(
            "a data: URL this large must be base64 text: ASCII, without quotes, "
            "backslashes or control characters",
            param=f"messages[{item.message}].content[{item.part}]",
        )
    url.sha256()
    return url


def _with(body: Mapping[str, Any], items: list[_Item], values: list[Any]) -> dict[str, Any]:
    messages = list(body["messages"])
    copied: set[int] = set()
    for item, value in zip(items, values, strict=True):
        if value is item.value:
            continue  # a DataUrl of the body's own, hashed where it is
        if item.message not in copied:
            copied.add(item.message)
            message = messages[item.message] = dict(messages[item.message])
            message["content"] = list(message["content"])
        content = messages[item.message]["content"]
        part = content[item.part] = dict(content[item.part])
        held = part[item.key]
        if item.url and isinstance(held, Mapping):
            part[item.key] = {**held, "url": value}
        else:
            part[item.key] = value
    return {**body, "messages": messages}


def hashing(body: Any, least: int = HASH_OFF_LOOP) -> Callable[[], Any] | None:
    """The work of hashing a chat ``body``'s inline media items (data URLs and inline
    data, not those named by a ``uuid``), when together they hold ``least`` bytes or
    more; else ``None`` (and for a body of any other shape: the plan refuses it). The
    work is a function to run in a worker thread: it returns ``body`` with each item as
    a [`DataUrl`][pd_policy_vllm.openai.wire.data_url.DataUrl] or a
    [`Canonical`][pd_policy_vllm.openai.wire.codec.Canonical] holding its digest (a new
    body sharing every other value; ``body`` is not changed), and raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] (400, naming the part) for a
    data URL that is not base64 text (see the module docs)."""
    if not isinstance(body, dict):
        return None
    items = _items(body)
    nodes = [_SIZED_NODES * max(len(items), 1)]
    if sum(_size(item.value, nodes) for item in items) < least:
        return None

    def work() -> Any:
        values = [_digested(item) for item in items]
        return _with(body, items, values)

    return work

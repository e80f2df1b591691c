"""Hostile request bodies: valid chat, completions and Responses bodies, mutated the ways a
client can break JSON or a body's shape.

Each example is ``(route, body bytes, mutation classes applied)``. The classes:
truncated, flipped bytes, deep nesting inserted at a random point, a key written twice
at a random depth, a lone surrogate escape, a huge number, a value of the wrong type at a
key the proxy reads, a body that is not an object, and none (the valid body itself, so
the properties see that the proxy still answers those).
"""

from __future__ import annotations

import copy
import json
import random
from typing import Any, Final

from hypothesis import strategies as st

from pd_policy_vllm.openai.wire.skim import SKIM_LEAST
from pd_policy_vllm.openai.wire.strict import MAX_DEPTH

CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
RESPONSES: Final = "/v1/responses"

TRUNCATED: Final = "truncated"
FLIPPED: Final = "flipped bytes"
DEEP: Final = "deep nesting"
TWICE: Final = "a key twice"
SURROGATE: Final = "lone surrogate"
HUGE: Final = "huge number"
WRONG_TYPE: Final = "wrong type"
NOT_OBJECT: Final = "not an object"
NONE: Final = "none"
CLASSES: Final = (TRUNCATED, FLIPPED, DEEP, TWICE, SURROGATE, HUGE, WRONG_TYPE, NOT_OBJECT, NONE)

Path = tuple[str | int, ...]
Example = tuple[str, bytes, frozenset[str]]

#: A placeholder string the bytes replace after the body is written (raw JSON no value has).
_SLOT: Final = "\u2063slot\u2063"
_LETTERS: Final = st.text(alphabet="abcxyz-_:", min_size=1, max_size=8)
_SMALL_URL: Final = "data:image/png;base64,iVBORw0KGgo="
#: Long enough for skim to cut it out of the body it parses.
_LONG_URL: Final = "data:image/png;base64," + "QUJD" * (SKIM_LEAST // 4 + 1)


def _image(key: str = "image_url") -> st.SearchStrategy[dict[str, Any]]:
    url = st.sampled_from([_SMALL_URL, _LONG_URL, "https://example.invalid/a.png"])
    return st.fixed_dictionaries(
        {"type": st.just(key), key: url.map(lambda u: {"url": u}) | url},
        optional={"uuid": _LETTERS},
    )


_TEXT_PART: Final = st.fixed_dictionaries({"type": st.just("text"), "text": _LETTERS})
_CONTENT: Final = _LETTERS | st.lists(_TEXT_PART | _image(), min_size=1, max_size=3)
_OPTIONS: Final = st.dictionaries(_LETTERS, st.integers(0, 4) | _LETTERS, max_size=2)
_COMMON: Final = {
    "max_tokens": st.integers(1, 16),
    "stream": st.booleans(),
    "n": st.integers(1, 2),
    "cache_salt": st.text(alphabet="abc123", min_size=1, max_size=8),
    "temperature": st.floats(0, 1),
}


def _chat() -> st.SearchStrategy[dict[str, Any]]:
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": _CONTENT}
    )
    return st.fixed_dictionaries(
        {"model": st.just("m"), "messages": st.lists(message, min_size=1, max_size=3)},
        optional={**_COMMON, "mm_processor_kwargs": _OPTIONS, "media_io_kwargs": _OPTIONS},
    )


def _completions() -> st.SearchStrategy[dict[str, Any]]:
    prompt = _LETTERS | st.lists(st.integers(0, 151_000), min_size=1, max_size=40)
    return st.fixed_dictionaries({"model": st.just("m"), "prompt": prompt}, optional=_COMMON)


def _responses() -> st.SearchStrategy[dict[str, Any]]:
    part = st.fixed_dictionaries(
        {"type": st.just("input_text"), "text": _LETTERS}
    ) | st.fixed_dictionaries(
        {"type": st.just("input_image"), "image_url": st.sampled_from([_SMALL_URL, _LONG_URL])}
    )
    item = st.fixed_dictionaries(
        {"role": st.just("user"), "content": _LETTERS | st.lists(part, min_size=1, max_size=3)}
    )
    return st.fixed_dictionaries(
        {"model": st.just("m"), "input": _LETTERS | st.lists(item, min_size=1, max_size=2)},
        optional={**_COMMON, "instructions": _LETTERS},
    )


BODIES: Final = {CHAT: _chat(), COMPLETIONS: _completions(), RESPONSES: _responses()}

#: Values of every JSON type, the odd ones weighted in: huge and negative numbers, empty and
#: URL-like strings, empty and nested containers (deep, but within the limit).
WRONG: Final[st.SearchStrategy[Any]] = st.one_of(
    st.sampled_from(
        [
            None,
            True,
            False,
            0,
            -1,
            2**31,
            2**64,
            -(2**63) - 1,
            10**30,
            0.5,
            -0.0,
            1e308,
            "",
            "data:",
            "data:image/png;base64,",
            "http://",
            "\u0000",
            [],
            [1],
            [[]],
            [{}],
            ["a"],
            {},
            {"url": 5},
            {"url": {"url": "x"}},
            {"a": {"b": []}},
        ]
    ),
    st.integers(1, MAX_DEPTH - 8).map(lambda n: json.loads("[" * n + "]" * n)),
    st.text(max_size=4),
)
#: Numbers past 64 bits, past a double, and past Python's 4300 digits, as the body's text.
HUGE_TEXTS: Final = [b"18446744073709551616", b"-9223372036854775809", b"1" + b"0" * 4299,
                     b"1" + b"0" * 4300, b"1e400", b"-1e999", b"1.5e308", b"1e-400",
                     b"123456789012345678901234567890.5"]  # fmt: skip
#: Keys the proxy reads, by route (the parts' keys are added to each part's path).
_READ: Final = {
    CHAT: ["messages", "n", "stream", "cache_salt", "mm_processor_kwargs", "media_io_kwargs",
           "max_tokens", "max_completion_tokens", "stream_options", "model", "tools"],
    COMPLETIONS: ["prompt", "n", "stream", "cache_salt", "max_tokens", "model"],
    RESPONSES: ["input", "instructions", "n", "stream", "cache_salt", "tools",
                "previous_response_id", "mm_processor_kwargs", "media_io_kwargs", "model"],
}  # fmt: skip
_ITEM_KEYS: Final = ["role", "content"]
_PART_KEYS: Final = ["type", "text", "image_url", "uuid", "input_audio", "video_url"]


def _paths(value: Any, path: Path = ()) -> list[Path]:
    """Every path to a value inside ``value`` (the body's own path, ``()``, first)."""
    out = [path]
    if isinstance(value, dict | list):
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            out += _paths(child, (*path, key))
    return out


def _read_paths(route: str, body: dict[str, Any]) -> list[Path]:
    """The paths of ``body`` the proxy reads: its keys, its items and their parts' keys, a
    URL's ``url`` (each may be absent: set, it is added)."""
    out: list[Path] = [(key,) for key in _READ[route]]
    items = body.get("messages" if route == CHAT else "input")
    field = "messages" if route == CHAT else "input"
    for i, item in enumerate(items if isinstance(items, list) else ()):
        out += [(field, i), *((field, i, key) for key in _ITEM_KEYS)]
        content = item.get("content")
        for j, part in enumerate(content if isinstance(content, list) else ()):
            out += [(field, i, "content", j), *((field, i, "content", j, k) for k in _PART_KEYS)]
            if isinstance(part.get("image_url"), dict):
                out.append((field, i, "content", j, "image_url", "url"))
    if route == COMPLETIONS and isinstance(body.get("prompt"), list):
        out.append(("prompt", 0))
    return out


def _set(body: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    head, *rest = path
    body[head] = _set(body[head], tuple(rest), value) if rest else value
    return body


def _write(value: Any, twice: int | None, counter: list[int]) -> str:
    # JSON with the ``twice``-th object (in writing order) naming its first key again.
    if isinstance(value, dict):
        index = counter[0]
        counter[0] += 1
        members = [f"{json.dumps(k)}:{_write(v, twice, counter)}" for k, v in value.items()]
        if index == twice and value:
            first = next(iter(value))
            members.append(f"{json.dumps(first)}:{json.dumps('again')}")
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_write(v, twice, counter) for v in value) + "]"
    return json.dumps(value)


@st.composite
def hostile(draw: st.DrawFn) -> Example:
    """A route, a body for it and the classes of mutation applied (see the module docs)."""
    route = draw(st.sampled_from(list(BODIES)))
    body: Any = draw(BODIES[route])
    # The valid body alone a seventh of the time, else two mutations: each about a fifth of
    # the time. Chosen by a Random seeded from the body and a draw: hypothesis draws any
    # one value (a class, a seed) again and again while it varies the rest, and favours
    # the first of a list; the bodies it draws vary most.
    rng = random.Random(f"{draw(st.integers(0, 2**64))} {json.dumps(body, sort_keys=True)}")
    mutations = CLASSES[:-1]
    chosen = {NONE} if rng.random() < 0.15 else {rng.choice(mutations), rng.choice(mutations)}
    applied: set[str] = set()
    if WRONG_TYPE in chosen:
        path = draw(st.sampled_from(_read_paths(route, body)))
        # A copy: a later mutation may write inside it, and WRONG's values are shared.
        body = _set(body, path, copy.deepcopy(draw(WRONG)))
        applied.add(WRONG_TYPE)
    if SURROGATE in chosen:
        strings = [p for p in _paths(body) if p and isinstance(_get(body, p), str)]
        if strings:
            path = draw(st.sampled_from(strings))
            lone = draw(st.sampled_from(["\ud800", "\udc00", "\udbff"]))
            body = _set(body, path, _get(body, path) + lone)
            applied.add(SURROGATE)
    slots: dict[str, bytes] = {}
    for kind in (k for k in (HUGE, DEEP) if k in chosen):
        paths = [p for p in _paths(body)[1:] if not _is_slot(_get(body, p))]
        if not paths:
            continue
        slot = f"{_SLOT}{kind}"
        body = _set(body, draw(st.sampled_from(paths)), slot)
        if kind == HUGE:
            slots[slot] = draw(st.sampled_from(HUGE_TEXTS))
        else:
            depth = draw(st.sampled_from([100_000, 1000, MAX_DEPTH + 1, MAX_DEPTH, MAX_DEPTH - 4]))
            opening, closing = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}")]))
            slots[slot] = opening * depth + b"1" + closing * depth
        applied.add(kind)
    if NOT_OBJECT in chosen:
        body = draw(st.sampled_from([[body], "body", 7, None, True, []]))
        applied.add(NOT_OBJECT)
    objects = sum(1 for p in _paths(body) if isinstance(_get(body, p), dict))
    twice = draw(st.integers(0, objects - 1)) if TWICE in chosen and objects else None
    applied |= {TWICE} if twice is not None else set()
    raw = _write(body, twice, [0]).encode()
    for slot, text in slots.items():
        raw = raw.replace(json.dumps(slot).encode(), text)
    if FLIPPED in chosen and raw:
        for _ in range(draw(st.integers(1, 3))):
            at = draw(st.integers(0, len(raw) - 1))
            byte = draw(st.sampled_from([*b'{}[]",:\\\x00\xff', draw(st.integers(0, 255))]))
            raw = raw[:at] + bytes([byte]) + raw[at + 1 :]
        applied.add(FLIPPED)
    if TRUNCATED in chosen and raw:
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
        applied.add(TRUNCATED)
    return route, raw, frozenset(applied or {NONE})


def _get(body: Any, path: Path) -> Any:
    for key in path:
        body = body[key]
    return body


def _is_slot(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(_SLOT)

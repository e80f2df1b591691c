"""What makes a parsed JSON text safe to walk and unambiguous: a bounded depth, and no object
that names a key twice.

Depth: every parser here, and every later walk of a body (its canonical JSON, its
uuids, a leg written again), recurses once a level on the stack the server runs on; a
body of ``[`` 100000 deep ends them in a ``RecursionError``. The parsers' own is caught
(they stop where the stack does), and a parsed value deeper than
[`MAX_DEPTH`][pd_policy_vllm.openai.wire.strict.MAX_DEPTH] is refused before any other walk.
A text holding no more ``[`` and ``{`` than the limit cannot nest deeper, so only a text
with more is walked for its depth.

A key twice: a parser keeps one of the two (msgspec and the standard library the last,
others the first), and the prefill leg is spliced from the client's bytes, which hold
both: a worker that keeps the other sees another request than the one the proxy
checked. The standard library's hook sees each object's members
([`unique`][pd_policy_vllm.openai.wire.strict.unique]); msgspec has none, so what it parsed
is checked by count ([`written_once`][pd_policy_vllm.openai.wire.strict.written_once]).

Cost: the counts use ``find``, which skips to the next byte sought at memory speed: a
body of ids or of base64 holds few of them. Walks are of the parsed value and within a
budget of nodes, never of a long list: an image's megabytes or a prompt's 100k ids are
never visited one by one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from itertools import chain
from typing import Any, Final, TypeVar

__all__ = [
    "MAX_DEPTH",
    "KeyTwice",
    "TooDeep",
    "checked",
    "count",
    "deeper_than",
    "shape",
    "too_deep",
    "twice_param",
    "unique",
    "written_once",
]

#: How deeply a JSON text may nest arrays and objects. The deepest real bodies are tools'
#: and ``response_format``'s JSON schemas: OpenAI's structured outputs allow 10 levels of
#: schema nesting, each two levels of JSON, under the body's own five. 128 is several times
#: that, and far inside Python's recursion limit (1000 frames), which every parser and
#: later walk shares with the server's own stack (a walk may take a few frames a level).
MAX_DEPTH: Final = 128

#: Nodes a walk counting a value's members visits at most: a chat body's, not a prompt's ids.
_BUDGET: Final = 512
#: Bytes a colon of a text above which its value is walked rather than written again: a
#: walk costs about as much a node as writing 250 bytes, and a text has about two nodes
#: a colon (its members, and the items of its lists).
_WALKED: Final = 512
#: Above this many bytes, a text's colons and brackets are first looked for one by one, up
#: to ``_FEW`` of them: a find costs a call, about as much as counting 500 bytes.
_LARGE: Final = 65536
_FEW: Final = 16
#: Every byte but the three ``shape`` counts.
_UNCOUNTED: Final = bytes(sorted(set(range(256)) - set(b"[{:")))
#: An escape that makes a colon: the count by colons cannot see it.
_ESCAPED_COLON: Final = re.compile(rb"\\u003[aA]")
#: The largest text whose key written twice an error names (a parse more).
_NAMED: Final = 1 << 20
#: A key an error's ``param`` may name: a field's name, not a client's text.
_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: What a parser or a struct field may hold that nests (exact types: a parse makes no others).
_CONTAINERS: Final = frozenset({dict, list, tuple})

T = TypeVar("T", str, bytes)


def _sparse(text: T, sought: T) -> int | None:
    # How many times ``sought`` occurs, when ``find`` finds each (at most _FEW); else None.
    at = -1
    for found in range(_FEW + 1):
        at = text.find(sought, at + 1)
        if at < 0:
            return found
    return None


def count(text: T, sought: T) -> int:
    """How many times ``sought`` occurs in ``text``. In a large text, ``find`` looks for each
    first: it skips to the next at memory speed, where a count reads every byte, so the
    few colons of a body of ids or of base64 cost no pass over it."""
    found = _sparse(text, sought) if len(text) > _LARGE else None
    return found if found is not None else text.count(sought)


def shape(raw: bytes) -> tuple[int, int]:
    """How many arrays and objects the JSON text ``raw`` opens (its ``[`` and ``{``, strings
    included), and how many colons it holds: one pass over a text with many of them."""
    if len(raw) > _LARGE:
        colons = _sparse(raw, b":")
        if colons is not None:
            return count(raw, b"[") + count(raw, b"{"), colons
    kept = raw.translate(None, _UNCOUNTED)
    colons = kept.count(b":")
    return len(kept) - colons, colons


def deeper_than(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether the parsed ``value`` nests lists and dicts deeper than ``limit``: a walk of its
    containers, a level at a time (never recursive)."""
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        children = chain(
            chain.from_iterable(item.values() for item in level if type(item) is dict),
            chain.from_iterable(item for item in level if type(item) is not dict),
        )
        level = [child for child in children if type(child) in _CONTAINERS]
    return False


def too_deep(opened: int, value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value``, parsed from a JSON text that opens ``opened`` arrays and objects
    ([`shape`][pd_policy_vllm.openai.wire.strict.shape]), nests deeper than ``limit``:
    walked only when ``opened`` is more than ``limit``."""
    return opened > limit and deeper_than(value, limit)


class KeyTwice(ValueError):
    """An object of the text names a key twice."""


def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A ``json`` ``object_pairs_hook``: the object, or ``KeyTwice`` when it names a key
    twice."""
    out = dict(pairs)
    if len(out) != len(pairs):
        raise KeyTwice("an object names a key twice")
    return out


def _tally(value: Any) -> tuple[int, int, bool]:
    # The members of the objects walked, the colons of the strings walked (keys too), and
    # whether the walk took in all of ``value`` (it skips a list longer than its budget).
    members = colons = 0
    whole, budget = True, _BUDGET
    stack: list[Any] = [[value]]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            members += len(item)
            colons += sum(count(key, ":") for key in item if ":" in key)
            children: Any = item.values()
        elif len(item) <= budget:
            children = item
        else:
            whole = False
            continue
        budget -= len(item)
        for child in children:
            if type(child) is str:
                if ":" in child:
                    colons += count(child, ":")
            elif type(child) is dict or type(child) is list:
                stack.append(child)
        if budget < 0:
            return members, colons, False
    return members, colons, whole


def written_once(
    raw: bytes, colons: int, value: Any, encode: Callable[[Any], bytes]
) -> bool | None:
    """Whether each object of the JSON text ``raw`` names each key once, ``raw`` holding
    ``colons`` colons ([`shape`][pd_policy_vllm.openai.wire.strict.shape]), ``value`` being
    its parse by a parser that keeps one of two equal keys, and ``encode`` a writer of
    ``value`` that writes a colon as itself. ``True`` or ``False`` when the count says;
    ``None`` when it cannot (parse with [`unique`][pd_policy_vllm.openai.wire.strict.unique]
    then).

    Why: each member the text writes has one colon outside strings, and each colon inside
    a string is one in the parsed string too; ``\\u003a`` is a colon only there. So with
    no member dropped, the text has as many colons as ``value`` (its members, and the
    colons of its strings) less those escapes; with one dropped, it has at least one more
    than that (the dropped member's), less at most the escapes: ``True`` when the counts
    match, whatever else is escaped. And when the text has no more colons than the
    members ``value`` is seen to hold, none was dropped.
    """
    if len(raw) > _WALKED * colons:
        # Few nodes for its bytes (an image, a prompt of ids): walked, never written again.
        members, inner, whole = _tally(value)
        if colons == members:
            return True
        written = members + inner if whole else count(encode(value), b":")
    else:
        written = encode(value).count(b":")  # as dense as the text: one pass
    if colons > written:
        return False
    escapes = len(_ESCAPED_COLON.findall(raw)) if raw.find(b"\\") >= 0 else 0
    return True if colons == written - escapes else None


class TooDeep(ValueError):
    """The text nests arrays and objects deeper than its limit."""


def checked(raw: bytes, value: Any, encode: Callable[[Any], bytes]) -> bool | None:
    """The checks of ``value``, parsed from ``raw`` by a parser that keeps one of two equal
    keys, in one call: raises [`TooDeep`][pd_policy_vllm.openai.wire.strict.TooDeep] past
    [`MAX_DEPTH`][pd_policy_vllm.openai.wire.strict.MAX_DEPTH], then answers as
    [`written_once`][pd_policy_vllm.openai.wire.strict.written_once] does."""
    opened, colons = shape(raw)
    if too_deep(opened, value):
        raise TooDeep()
    return written_once(raw, colons, value, encode)


class _Twice(dict[str, Any]):
    __slots__ = ("key",)
    key: str


def _marking(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) == len(pairs):
        return out
    twice = _Twice(out)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            twice.key = key
            break
        seen.add(key)
    return twice


def _step(path: str | None, key: str | int) -> str | None:
    # None: a key on the way is not a field's name.
    if path is None:
        return None
    if isinstance(key, int):
        return f"{path}[{key}]"
    if _NAME.fullmatch(key) is None:
        return None
    return f"{path}.{key}" if path else key


def twice_param(raw: bytes | bytearray | str) -> str:
    """The ``param`` naming where the JSON text ``raw`` first names a key twice
    (``messages[0].content[1].uuid``), or ``body`` when a key on the way is not a field's
    name (an error never echoes a client's text), none is twice, or ``raw`` is over 1 MiB
    (the standard library's parse would cost a hostile client's refusal ten times its
    own)."""
    if len(raw) > _NAMED:
        return "body"
    try:
        value = json.loads(raw, object_pairs_hook=_marking)
    except (ValueError, RecursionError):
        # Not JSON past the key twice (the hook saw it first), or deeper than the stack.
        return "body"
    stack: list[tuple[Any, str | None]] = [(value, "")] if isinstance(value, dict | list) else []
    while stack:
        item, path = stack.pop()
        if isinstance(item, _Twice):
            return _step(path, item.key) or "body"
        pairs = item.items() if isinstance(item, dict) else enumerate(item)
        stack += reversed([(c, _step(path, k)) for k, c in pairs if isinstance(c, dict | list)])
    return "body"

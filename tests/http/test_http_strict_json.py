"""Hostile JSON, parsed: nesting past the limit, a key written twice at any depth, lone
surrogates and numbers past a double or past Python's digits, on both parser paths
(msgspec and the standard library), through ``loads``, ``skim`` and a worker's reply.
Each is a typed 400 for a client (a 502 for a worker), never a ``RecursionError``, and
the two paths give one answer."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import MalformedRequest, WorkerStreamError
from pd_policy_vllm.http.calls import parsed
from pd_policy_vllm.openai.plan.legs import read_prefill
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.wire import codec
from pd_policy_vllm.openai.wire.skim import SKIM_LEAST, skim
from pd_policy_vllm.openai.wire.strict import MAX_DEPTH, twice_param

#: A data URL skim cuts out of a chat body: its checks then run on the small copy.
URL = "data:image/png;base64," + "A" * SKIM_LEAST


@pytest.fixture(params=[True, False], ids=["msgspec", "stdlib"])
def path(request: pytest.FixtureRequest) -> Iterator[bool]:
    before, codec.USE_MSGSPEC = codec.USE_MSGSPEC, request.param
    try:
        yield request.param
    finally:
        codec.USE_MSGSPEC = before


def refused(parse: Callable[[bytes], Any], raw: bytes) -> MalformedRequest:
    with pytest.raises(MalformedRequest) as caught:
        parse(raw)
    assert caught.value.status == 400
    return caught.value


def chat(*parts: Any, **fields: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "hi"}, *parts]
    return {"model": "m", "messages": [{"role": "user", "content": content}], **fields}


def image(**part: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": URL}, **part}


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


def in_body(deep: bytes) -> list[bytes]:
    """``deep`` where a client could put it: a message, a uuid, the processor's options,
    a prompt, a Responses input, beside a data URL skim cuts out."""
    where = [b'{"messages": %s}', b'{"prompt": %s}', b'{"input": %s}',
             b'{"model": "m", "n": 1, "mm_processor_kwargs": {"a": %s}}']  # fmt: skip
    body = json.dumps(chat(image(uuid="@@"))).encode()
    return [w % deep for w in where] + [body.replace(b'"@@"', deep)]


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 1000, 100_000])
@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_nesting_past_the_limit_is_a_400_on_both_paths(
    path: bool, depth: int, opening: bytes
) -> None:
    closing = b"]" if opening == b"[" else b"}"
    deep = opening * depth + b"1" + closing * depth
    for raw in in_body(deep):
        for parse in (codec.loads, skim):
            error = refused(parse, raw)
            assert error.param == "body" and "deeper than 128" in error.message


def test_nesting_to_the_limit_is_taken_on_both_paths(path: bool) -> None:
    # The body itself is a level: its deepest value is the limit's.
    raw = b'{"messages": %s}' % nested(MAX_DEPTH - 1)
    assert codec.loads(raw)["messages"] == json.loads(raw)["messages"]
    refused(codec.loads, b'{"messages": %s}' % nested(MAX_DEPTH))


@pytest.mark.parametrize("objects", [0, 8])
def test_nesting_past_the_limit_beside_a_large_string_is_a_400(path: bool, objects: int) -> None:
    # Over 64 KiB with few colons: its [ and { are counted by find, not in one pass; and
    # neither alone is past the limit.
    arrays = MAX_DEPTH - objects
    deep = b"[" * arrays + b'{"a":' * objects + b"1" + b"}" * objects + b"]" * arrays
    raw = b'{"input": "%s", "a": %s}' % (b"x" * 100_000, deep)
    assert "deeper than 128" in refused(codec.loads, raw).message


def test_brackets_inside_strings_are_not_nesting(path: bool) -> None:
    # More [ and { than the limit, all in strings: walked, and found shallow.
    raw = json.dumps({"messages": ["[{" * 200, {"a": "{" * 300}]}).encode()
    assert codec.loads(raw) == json.loads(raw)


TWICE = [
    (b'{"model": "m", "cache_salt": "a", "cache_salt": "b"}', "cache_salt"),
    (b'{"a": 1, "\\u0061": 2}', "a"),  # one key, two spellings
    (b'{"n": 1, "x": "\\u003a", "n": 2}', "n"),  # an escaped colon hides no member
    (b'{"messages": [{"role": "user", "role": "system"}]}', "messages[0].role"),
    (b'{"m": [{"c": [{}, {"uuid": 1, "uuid": 2}]}]}', "m[0].c[1].uuid"),
    (b'{"key with space": {"a": 1, "a": 1}}', "body"),  # only field names are named
    (b'[{"a": 1}, {"b": [{"c": {"d": 1, "d": 1}}]}]', "[1].b[0].c.d"),
    (b'{"prompt": [%s1], "stop": "Q:", "stop": "A:"}' % (b"7," * 50_000), "stop"),
]


@pytest.mark.parametrize(("raw", "param"), TWICE)
def test_a_key_written_twice_is_a_400_naming_it(path: bool, raw: bytes, param: str) -> None:
    error = refused(codec.loads, raw)
    assert error.param == param and "names a key twice" in error.message


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "cache_salt": "a", "cache_salt": "b", "messages": %s}',
        b'{"model": "m", "messages": %s, "messages": []}',
    ],
)
def test_a_key_written_twice_beside_a_data_url_is_a_400(path: bool, body: bytes) -> None:
    # skim parses its small copy (the URL cut out): the check runs on that copy.
    raw = body % json.dumps(chat(image())["messages"]).encode()
    assert len(raw) > SKIM_LEAST
    assert refused(skim, raw).param in ("cache_salt", "messages")
    inner = json.dumps(chat(image(uuid="u"))).encode().replace(b'"uuid"', b'"uuid": "v", "uuid"')
    assert refused(skim, inner).param == "messages[0].content[1].uuid"


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1, "a": 2, "b": }',
        b'{"a": 1, "a": 2, "b": "\\q"}',
        b'{"a":1,"a":2,"b":%s}' % nested(2000),
    ],
)
def test_a_key_twice_in_a_text_broken_further_on_is_a_400(path: bool, raw: bytes) -> None:
    # The standard library's hook sees the key first; naming it parses again, and that
    # parse fails further on: the body is named then.
    assert refused(codec.loads, raw).param == "body"


def test_a_key_twice_in_a_large_body_is_named_as_the_body(path: bool) -> None:
    # Naming it takes another parse: not for a body over 1 MiB.
    raw = b'{"p": "%s", "a": 1, "a": 2}' % (b"x" * (1 << 20))
    assert refused(codec.loads, raw).param == "body"
    assert twice_param(b'{"a": 1, "a": 2}') == "a"


NAMES = st.text(alphabet='ab:\\"\u00e9\ud7ff', max_size=3)
LEAVES = st.none() | st.integers(-5, 2**70) | st.text(alphabet='a:\\"\u00e9\n', max_size=6)


def _write(draw: st.DrawFn, value: Any) -> str:
    # JSON for ``value``, each object sometimes with a member written again, each colon of a
    # string sometimes escaped (\u003a: a colon the parse sees, the bytes do not).
    if isinstance(value, dict):
        members = [(k, _write(draw, v)) for k, v in value.items()]
        if members and draw(st.integers(0, 7)) == 0:
            key, _ = draw(st.sampled_from(members))
            members.insert(draw(st.integers(0, len(members))), (key, _write(draw, draw(LEAVES))))
        keys = [json.dumps(k) for k, _ in members]
        return "{" + ",".join(f"{k}: {v}" for k, (_, v) in zip(keys, members, strict=True)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_write(draw, v) for v in value) + "]"
    text = json.dumps(value)
    if isinstance(value, str) and draw(st.booleans()):
        text = text.replace(":", "\\u003a" if draw(st.booleans()) else "\\u003A")
    return text


@st.composite
def texts(draw: st.DrawFn) -> str:
    value = draw(
        st.recursive(
            LEAVES,
            lambda inner: st.lists(inner, max_size=4) | st.dictionaries(NAMES, inner, max_size=4),
            max_leaves=16,
        )
    )
    return _write(draw, value)


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    if len({k for k, _ in pairs}) != len(pairs):
        raise KeyError("twice")
    return dict(pairs)


@given(texts())
def test_the_count_agrees_with_the_standard_librarys_hook(text: str) -> None:
    # msgspec has no hook: its value is checked by counting colons. The hook's answer is
    # the contract, on every text, escaped colons and keys included.
    try:
        expected = json.loads(text, object_pairs_hook=_unique)
    except KeyError:
        expected = MalformedRequest
    event(f"a key twice: {expected is MalformedRequest}; escaped colon: {'u003' in text}")
    for use in (True, False):
        before, codec.USE_MSGSPEC = codec.USE_MSGSPEC, use
        try:
            got = codec.loads(text.encode())
        except MalformedRequest:
            got = MalformedRequest
        finally:
            codec.USE_MSGSPEC = before
        assert got == expected


SURROGATES = [b'{"a": "\\ud800"}', b'{"\\udc00": 1}', b'[["x\\ud800\\ud800"]]', b'"\\udfff"']


@pytest.mark.parametrize("raw", SURROGATES)
def test_a_lone_surrogate_anywhere_is_a_400_that_does_not_quote_it(path: bool, raw: bytes) -> None:
    error = refused(codec.loads, raw)
    assert error.param == "body" and "\\ud" not in error.message and "\ud800" not in error.message
    assert codec.loads(b'["\\ud83d\\ude00"]') == ["\U0001f600"]  # a pair is one character


@pytest.mark.parametrize(
    "raw",
    [b"18446744073709551616", b"-9223372036854775809", b"1" + b"0" * 4299, b"1e308", b"1e-400"],
)
def test_numbers_past_64_bits_parse_alike_on_both_paths(path: bool, raw: bytes) -> None:
    assert codec.loads(b"[%s]" % raw) == json.loads(b"[%s]" % raw)


@pytest.mark.parametrize(
    "raw", [b"1" + b"0" * 4300, b"1e309", b"-1e400", b"1" + b"0" * 400 + b".5"]
)
def test_numbers_past_a_double_or_4300_digits_are_a_400_without_them(
    path: bool, raw: bytes
) -> None:
    error = refused(codec.loads, b'{"max_tokens": %s}' % raw)
    assert error.param == "body" and raw.decode()[:6] not in error.message


DEEP_REPLIES = [
    b'{"prompt_token_ids": [1], "kv_transfer_params": %s}' % nested(100_000, b"{}"),
    b'{"prompt_token_ids": [1], "kv_transfer_params": {"a": %s}}' % nested(MAX_DEPTH + 1),
    b'{"prompt_token_ids": [1], "kv_transfer_params": {}, "usage": %s}' % nested(500),
    b'{"prompt_token_ids": %s, "kv_transfer_params": {}}' % nested(100_000),
    b'{"choices": [{"prompt_token_ids": [1]}], "kv_transfer_params": %s}' % nested(500, b"{}"),
]


@pytest.mark.parametrize("raw", DEEP_REPLIES)
@pytest.mark.parametrize("route", [Route.CHAT, Route.COMPLETIONS])
def test_a_workers_reply_nested_past_the_limit_is_a_502(
    path: bool, raw: bytes, route: Route
) -> None:
    with pytest.raises(WorkerStreamError) as caught:
        read_prefill(raw, route)
    assert caught.value.status == 502
    with pytest.raises(WorkerStreamError) as caught:
        parsed(raw, "decode", "the decode response")
    assert caught.value.status == 502

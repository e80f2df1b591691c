"""The HTTP adapter's JSON: msgspec where it gives the standard library's answer, the
standard library where it would not, and one answer either way."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import MalformedRequest
from pd_policy_vllm.openai.wire import codec

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    # Wide floats: the exponent forms (1e+16, 5e-324) are where the libraries differ.
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture
def stdlib() -> Iterator[None]:
    before = codec.USE_MSGSPEC
    codec.USE_MSGSPEC = False
    try:
        yield
    finally:
        codec.USE_MSGSPEC = before


def _both(fn: Any, *args: Any) -> tuple[Any, Any]:
    """``fn`` under msgspec and under the standard library: each its value or its error type."""
    out = []
    for use in (True, False):
        before, codec.USE_MSGSPEC = codec.USE_MSGSPEC, use
        try:
            out.append(fn(*args))
        except Exception as exc:
            out.append(type(exc))
        finally:
            codec.USE_MSGSPEC = before
    return out[0], out[1]


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False


def test_msgspec_is_installed_with_the_http_extra() -> None:
    # Otherwise every property below compares the fallback with itself.
    assert codec.USE_MSGSPEC


@given(VALUES)
def test_canonical_is_the_standard_librarys_bytes(value: Any) -> None:
    event(f"has a float: {_has_float(value)}")
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    fast, slow = _both(codec.canonical, value)
    assert fast == slow == expected.encode("utf-8", "surrogatepass")


def test_canonical_of_a_float_exponent_and_a_lone_surrogate() -> None:
    # The two cases msgspec writes differently or not at all.
    assert codec.canonical({"b": 1e16, "a": "\ud800"}) == '{"a":"\ud800","b":1e+16}'.encode(
        "utf-8", "surrogatepass"
    )


@given(VALUES)
def test_dumps_round_trips_on_both_paths(value: Any) -> None:
    fast, slow = _both(codec.dumps, value)
    assert json.loads(fast) == json.loads(slow) == value


ODD_TEXTS = ['{"a": NaN}', "[Infinity]", "[-Infinity]", "[1e400]", '"\\ud800"', "tru",
             '{"a":1,"a":2}', "", "{", "[1,]", "12345678901234567890123", '{"a":"\\u00e9"}',
             " [1] "]  # fmt: skip
TEXTS = VALUES.map(json.dumps) | st.sampled_from(ODD_TEXTS) | st.text(max_size=12)


@given(TEXTS)
def test_loads_gives_one_answer_on_both_paths(text: str) -> None:
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "surrogatepass")
    fast, slow = _both(codec.loads, raw)
    event(f"refused: {fast is MalformedRequest}")
    assert fast == slow or (
        isinstance(fast, float) and math.isnan(fast) and isinstance(slow, float)
    )
    if fast is not MalformedRequest:
        assert fast == json.loads(text)
    # The proxy reads a client's body into a bytearray: the same answers from one.
    in_buffer = _both(codec.loads, bytearray(raw))
    assert in_buffer == (fast, slow) or (isinstance(fast, float) and math.isnan(fast))


@pytest.mark.parametrize(
    "raw", [b'{"a": NaN}', b"[Infinity]", b"[1e400]", b'"\\ud800"', b"{", b'"\xff"', b"[1] x"]
)
@pytest.mark.parametrize("use", [True, False])
def test_loads_refuses_what_is_not_strict_json(raw: bytes, use: bool) -> None:
    before, codec.USE_MSGSPEC = codec.USE_MSGSPEC, use
    try:
        with pytest.raises(MalformedRequest) as caught:
            codec.loads(raw, what="the prefill response")
    finally:
        codec.USE_MSGSPEC = before
    assert caught.value.status == 400 and caught.value.param == "body"
    assert caught.value.message.startswith("the prefill response is not JSON")


IDS: st.SearchStrategy[Any] = (
    st.lists(st.integers(0, 300_000), min_size=1, max_size=8)
    | st.lists(
        st.integers(0, 300_000) | st.sampled_from([-1, True, False, 1.0, "7", None, [1], 2**64]),
        max_size=8,
    )
    | st.sampled_from([None, {}, "1,2", 3, [], [0]])
)


@given(IDS)
def test_token_ids_one_answer_on_both_paths(value: Any) -> None:
    fast, slow = _both(codec.token_ids, value)
    event(f"ids: {fast is not None}")
    assert fast == slow
    ok = isinstance(value, list) and bool(value) and all(type(t) is int and t >= 0 for t in value)
    assert (fast is not None) == ok
    if ok:
        assert fast == tuple(value)


def test_token_ids_refuses_json_booleans(stdlib: None) -> None:
    # true == 1 in Python: a check by equality or isinstance would pass [1, true].
    assert codec.token_ids([1, True]) is None
    assert codec.token_ids([0, False]) is None
    assert codec.token_ids([1, 0]) == (1, 0)

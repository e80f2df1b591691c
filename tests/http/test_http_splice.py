"""The prefill leg spliced from the client's bytes parses to the leg built by parsing.

Bodies are generated JSON objects, with the members the prefill leg rewrites present
or not, values that hold quotes, backslashes, brackets and braces inside strings, and
written in varied ways (indented or not, ASCII-escaped or not, spaces around the
separators): the splice must find each member's value wherever it is, and leave the
rest as sent.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import KvConnectorMode, PrefillKv, plan_kv_handoff
from pd_policy_vllm.openai.plan.legs import prefill_body, prefill_bytes
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.wire import codec
from pd_policy_vllm.openai.wire.splice import members, splice

TRICKY = st.sampled_from(['"', "\\", '\\"', "{", "}", "[", "]", ",", ":", " ", "é", "\n", "\u2028"])
TEXT = st.lists(TRICKY | st.text(max_size=4), max_size=5).map("".join)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=10,
)
REWRITTEN = ["stream", "stream_options", "n", "min_tokens", "max_tokens",
             "max_completion_tokens", "return_token_ids", "kv_transfer_params"]  # fmt: skip
KEYS = st.sampled_from([*REWRITTEN, "messages", "prompt", "model"]) | TEXT
BODIES = st.dictionaries(KEYS, VALUES, max_size=8)


@st.composite
def written(draw: st.DrawFn, value: Any) -> bytes:
    """``value`` as one of the JSON texts a client may send for it."""
    indent = draw(st.sampled_from([None, 0, 2]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
    text = json.dumps(value, indent=indent, separators=separators,
                      ensure_ascii=draw(st.booleans()))  # fmt: skip
    pad = draw(st.sampled_from(["", " ", "\n\t "]))
    return (pad + text + pad).encode()


HANDOFFS = st.sampled_from(
    [
        plan_kv_handoff(PrefillKv(mode), n=1)
        for mode in (KvConnectorMode.NIXL, KvConnectorMode.PASSTHROUGH)
    ]
)


@given(BODIES.flatmap(lambda body: st.tuples(st.just(body), written(body))),
       st.sampled_from(list(Route)), HANDOFFS)  # fmt: skip
def test_the_spliced_prefill_leg_parses_to_the_parsed_one(
    case: tuple[dict[str, Any], bytes], route: Route, handoff: Any
) -> None:
    body, raw = case
    parsed = codec.loads(raw)
    spliced = prefill_bytes(raw, parsed, route, handoff)
    assert spliced is not None
    expected = prefill_body(parsed, route, handoff)
    leg = codec.loads(bytes(spliced))
    assert leg == expected
    chunks = spliced.chunks(small=64)
    assert b"".join(chunks) == bytes(spliced)
    assert not any(len(a) < 64 and len(b) < 64 for a, b in itertools.pairwise(chunks))
    assert list(leg) == list(expected)  # the same members in the same order
    event(f"rewritten members present: {min(len(set(body) & set(REWRITTEN)), 3)}")
    spaced = any(c in raw for c in (b" ", b"\n"))
    event(f"written with whitespace: {spaced}")


@given(VALUES.flatmap(written))
def test_members_reads_an_object_and_nothing_else(raw: bytes) -> None:
    parsed = codec.loads(raw)
    found = members(raw)
    if isinstance(parsed, dict):
        assert found is not None
        assert [key for key, *_ in found] == list(parsed)
        for key, _, start, end in found:  # each value's span parses to its value
            assert codec.loads(raw[start:end]) == parsed[key]
        assert codec.loads(splice(raw, found, {})) == parsed
    else:
        assert found is None
    event(f"object: {isinstance(parsed, dict)}")


def test_the_media_is_the_clients_bytes_in_the_spliced_leg() -> None:
    image = "data:image/png;base64," + "A/+z" * 25_000
    raw = json.dumps({"messages": [{"content": [{"image_url": {"url": image}}]}],
                      "stream": True, "max_tokens": 9}).encode()  # fmt: skip
    handoff = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
    spliced = prefill_bytes(raw, codec.loads(raw), Route.CHAT, handoff)
    assert spliced is not None
    start = raw.index(b'{"messages"') + 1
    assert bytes(spliced).startswith(b"{" + raw[start : raw.index(b', "stream"')])
    # Sent as its parts, the image is a view of the client's buffer, not a copy of it.
    (image_part,) = [part for part in spliced.chunks() if len(part) > 100_000]
    assert isinstance(image_part, memoryview)
    assert image_part.obj is raw


def test_a_body_that_is_not_an_object_of_members_is_not_spliced() -> None:
    handoff = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
    for raw in (b"[1]", b'"x"', b"{", b'{"a" 1}', b'{"a":1,}', b'{"a":1} x', b""):
        assert prefill_bytes(raw, {}, Route.CHAT, handoff) is None

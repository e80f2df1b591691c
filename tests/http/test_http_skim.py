"""A skimmed chat body is the parsed body, up to where its data URLs are kept.

``skim`` leaves each long data URL of a media part in the client's bytes. The
properties hold it to ``loads`` on bodies written as clients write them: the same
value, the same bytes written out (every leg), the same media identities (the salt
fold and the prefill affinity), the same refusals, and no kept URL in a stripped
decode leg. Lengths are cut to 8 bytes here so that the strategies reach kept URLs
often (each property records how often).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import MalformedRequest, PolicyError
from pd_policy_vllm.openai.media.parts import without_media
from pd_policy_vllm.openai.plan.request import Route, policy_request
from pd_policy_vllm.openai.wire import codec
from pd_policy_vllm.openai.wire.data_url import DataUrl
from pd_policy_vllm.openai.wire.skim import skim

LEAST = 8
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
# What a URL may hold beside base64: escapes when written, non-ASCII, a comma.
ODD = st.sampled_from(['"', "\\", "é", "\n", ",", "\u2028", " "])
CLEAN = st.text(alphabet=B64, min_size=LEAST, max_size=24)
PAYLOAD = CLEAN | st.lists(st.text(alphabet=B64, max_size=12) | ODD, max_size=4).map("".join)
URLS = st.one_of(
    st.builds(lambda mime, data: f"data:{mime};base64,{data}",
              st.sampled_from(["image/png", "image/jpeg", "video/mp4", "audio/wav"]), PAYLOAD),
    st.builds(lambda data: f"data:{data}", PAYLOAD),  # no comma
    st.builds(lambda data: f"DATA:image/png;base64,{data}", PAYLOAD),
    st.just("https://media.example/a.png"),
)  # fmt: skip


def _part(kind: str, url: str, wrapped: bool) -> dict[str, Any]:
    if kind == "text":
        return {"type": "text", "text": url}
    key = "image_url" if kind == "input_image" else kind
    return {"type": kind, key: {"url": url, "detail": "low"} if wrapped else url}


MEDIA = st.sampled_from(["image_url", "video_url", "audio_url", "input_image"])
PARTS = st.one_of(
    st.builds(_part, MEDIA, URLS, st.booleans()),
    st.builds(_part, MEDIA, URLS, st.booleans()),
    st.builds(_part, st.just("text"), URLS, st.booleans()),
    st.builds(lambda url: {"uuid": "u1", "image_url": {"url": url}}, URLS),
)
MESSAGES = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system"]),
            "content": st.lists(PARTS, min_size=1, max_size=3) | st.just("hi"),
        }
    ),
    min_size=1,
    max_size=3,
)
BODIES = st.fixed_dictionaries(
    {"model": st.just("m"), "messages": MESSAGES},
    optional={
        "metadata": st.dictionaries(st.sampled_from(["k", "data:x"]), URLS, max_size=1),
        "stream": st.booleans(),
        "cache_salt": st.just("s1"),
    },
)


@st.composite
def clients_bytes(draw: st.DrawFn) -> tuple[dict[str, Any], bytes]:
    """A body, and one of the JSON texts a client may send for it."""
    body = draw(BODIES)
    indent = draw(st.sampled_from([None, 0, 2]))
    separators = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
    text = json.dumps(body, indent=indent, separators=separators,
                      ensure_ascii=draw(st.booleans()))  # fmt: skip
    raw = (draw(st.sampled_from(["", " ", "\n\t "])) + text).encode()
    if draw(st.integers(0, 3)) == 0:
        raw = raw.replace(b"/", b"\\/")  # JSON may escape a slash
    return body, raw


def _kept(value: Any) -> int:
    if isinstance(value, DataUrl):
        return 1
    if isinstance(value, dict):
        return sum(_kept(v) for v in value.values())
    if isinstance(value, list):
        return sum(_kept(v) for v in value)
    return 0


def _outcome(body: Any) -> Any:
    try:
        return policy_request(body, Route.CHAT, request_id="r", mrope=False, nonce="n")
    except PolicyError as exc:
        return (type(exc), exc.param)


@given(clients_bytes())
def test_a_skimmed_body_is_the_parsed_body(case: tuple[dict[str, Any], bytes]) -> None:
    _, raw = case
    parsed = codec.loads(raw)
    skimmed = skim(raw, least=LEAST)
    kept = _kept(skimmed)
    event(f"data URLs kept: {min(kept, 2)}")
    assert skimmed == parsed
    assert codec.dumps(skimmed) == codec.dumps(parsed)  # every leg: the same bytes
    assert codec.canonical(skimmed) == codec.canonical(parsed)
    assert _outcome(skimmed) == _outcome(parsed)  # identities, the salt, the refusals
    try:
        stripped = without_media(skimmed)
    except MalformedRequest:
        return
    assert _kept(stripped) == 0  # a stripped decode leg keeps no URL
    assert stripped == without_media(parsed)


def _broken(raw: bytes, at: int, how: int, in_url: bool) -> bytes:
    # Anywhere, or inside a data URL (where the leniency lies).
    urls = [i for i in range(len(raw)) if raw.startswith(b"data:", i)]
    at = urls[at % len(urls)] + 5 + at % 7 if in_url and urls else at % (len(raw) + 1)
    return [raw[:at], raw[:at] + b"\x01" + raw[at:], raw[:at] + b'"' + raw[at:],
            raw[:at] + b"\\" + raw[at:], raw[:at] + b"\xff" + raw[at:]][how]  # fmt: skip


def _control_inside(value: Any) -> bool:
    if isinstance(value, DataUrl):
        return any(byte < 0x20 for byte in value.view.tobytes())
    if isinstance(value, dict):
        return any(_control_inside(v) for v in value.values())
    if isinstance(value, list):
        return any(_control_inside(v) for v in value)
    return False


@given(clients_bytes(), st.integers(min_value=0), st.integers(min_value=0, max_value=4),
       st.booleans())  # fmt: skip
def test_a_body_loads_refuses_is_refused_but_for_a_control_character_in_a_kept_url(
    case: tuple[dict[str, Any], bytes], at: int, how: int, in_url: bool
) -> None:
    raw = _broken(case[1], at, how, in_url)
    try:
        parsed = codec.loads(raw)
    except MalformedRequest:
        try:
            skimmed = skim(raw, least=LEAST)
        except MalformedRequest:
            event("refused by both")
            return
        # The one leniency (module docs): the worker that parses these bytes refuses them.
        event("a control character let through")
        assert _control_inside(skimmed)
        return
    event("still JSON")
    assert skim(raw, least=LEAST) == parsed


def test_a_long_image_is_kept_in_the_body_and_hashed_there() -> None:
    url = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 40).decode()
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "what?"},
            {"type": "image_url", "image_url": {"url": url}}]}]}  # fmt: skip
    raw = json.dumps(body).encode()
    skimmed = skim(raw)
    kept = skimmed["messages"][0]["content"][1]["image_url"]["url"]
    assert isinstance(kept, DataUrl)
    assert kept.raw is raw  # a span of the client's bytes, not a copy
    assert kept.head() == "data:image/png;base64,"
    assert policy_request(skimmed, Route.CHAT, request_id="r", mrope=False) == policy_request(
        body, Route.CHAT, request_id="r", mrope=False
    )


@pytest.mark.parametrize(
    "where",
    [
        lambda url: {"messages": [{"role": "user", "content": [{"type": "text", "text": url}]}]},
        lambda url: {"messages": [{"role": "user", "content": url}]},
        lambda url: {"input": [{"type": "input_image", "image_url": url}]},
        lambda url: {"messages": [], "metadata": {"k": url}},
        lambda url: {"messages": [], url: 1},  # a key
    ],
)
def test_a_long_data_url_anywhere_but_a_media_part_is_parsed_as_a_string(where: Any) -> None:
    body = where("data:image/png;base64," + "A" * 10_000)
    skimmed = skim(json.dumps(body).encode())
    assert skimmed == body
    assert _kept(skimmed) == 0


def test_no_client_can_write_a_marker() -> None:
    # The markers hold a token drawn for the process; a string shaped like one is text.
    image = "data:image/png;base64," + "A" * 9000
    forged = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "0" * 32 + ":0"}},
        {"type": "image_url", "image_url": {"url": image}}]}]}  # fmt: skip
    skimmed = skim(json.dumps(forged).encode())
    assert skimmed["messages"][0]["content"][0]["image_url"]["url"] == "0" * 32 + ":0"
    assert isinstance(skimmed["messages"][0]["content"][1]["image_url"]["url"], DataUrl)


def test_a_data_url_is_only_a_span_between_the_quotes_of_a_string() -> None:
    raw = b'{"a":"data:x"}'
    assert str(DataUrl(raw, 6, 12)) == "data:x"
    for start, end in ((5, 12), (6, 13), (0, 12), (7, 6)):
        with pytest.raises(ValueError, match="between the quotes"):
            DataUrl(raw, start, end)
    assert DataUrl(raw, 6, 12).head() == "data:x"  # no comma: the URL, up to the limit


def test_a_data_url_with_non_ascii_written_raw_is_parsed_as_a_string() -> None:
    # Its bytes are its UTF-8, but a kept URL is ASCII: its scheme is read as text.
    url = "data:é" + "A" * 9000
    for kind in ("image_url", "video_url"):
        body = {"messages": [{"role": "user", "content": [{"type": kind, kind: url}]}]}
        skimmed = skim(json.dumps(body, ensure_ascii=False).encode())
        assert _kept(skimmed) == 0
        assert _outcome(skimmed) == _outcome(body)


def test_an_escaped_quote_before_data_is_text_and_costs_no_kept_url() -> None:
    image = "data:image/png;base64," + "A" * 9000
    body = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": 'say "data:' + "B" * 9000},
        {"type": "image_url", "image_url": {"url": image}}]}]}  # fmt: skip
    skimmed = skim(json.dumps(body).encode())
    assert skimmed == body
    assert isinstance(skimmed["messages"][0]["content"][1]["image_url"]["url"], DataUrl)


def test_a_kept_url_is_written_alike_without_msgspec() -> None:
    # The standard library's encoder writes a kept URL as the string it stands for: the
    # same bytes, and the same canonical form, as msgspec's copy of the client's.
    url = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 40).decode()
    body = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": url}]}]}
    skimmed = skim(json.dumps(body).encode())
    assert _kept(skimmed) == 1
    written, sorted_ = codec.dumps(skimmed), codec.canonical(skimmed)
    before, codec.USE_MSGSPEC = codec.USE_MSGSPEC, False
    try:
        assert (codec.dumps(skimmed), codec.canonical(skimmed)) == (written, sorted_)
        assert codec.loads(codec.dumps(skimmed)) == body
    finally:
        codec.USE_MSGSPEC = before

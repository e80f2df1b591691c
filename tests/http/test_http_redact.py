"""The redactor the proxy relays its workers' words through: every key, by value, in text
and in each form JSON may give it in bytes; a stream redacted piece by piece whatever its
cuts, holding back only a tail that may start a key; and a leg's error that holds none of
the keys even as an exception, which is what a log line would print."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from aiohttp import web
from fleet_stands import serving
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import WorkerFailedToStart
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.calls import post_json
from pd_policy_vllm.http.redact import MIN_ANSWER_KEY, REDACTED, Redactor
from pd_policy_vllm.http.upstream import Upstream

KEYS = ("wk-0123456789", "ck/with+slash=", "ak-ünïcode-key")
REDACTOR = Redactor(KEYS)


def test_every_key_of_the_keys_is_redacted_and_none_other() -> None:
    redactor = Redactor.of(Keys("w0rker-key", ("client-1-key", "client-2-key"), ("admin-key",)))
    text = "Bearer w0rker-key, client-1-key client-2-key admin-key; not a key"
    said = "Bearer <redacted>, <redacted> <redacted> <redacted>; not a key"
    assert redactor.text(text) == said
    assert redactor.data(text.encode()) == said.encode()
    assert Redactor.of(Keys()).text(text) == text and Redactor().data(b"x") == b"x"


@pytest.mark.parametrize("key", KEYS)
def test_a_key_is_redacted_from_bytes_in_each_form_json_gives_it(key: str) -> None:
    for encoded in (
        json.dumps({"k": key}).encode(),
        json.dumps({"k": key}, ensure_ascii=False).encode(),
        json.dumps({"k": key}).replace("/", "\\/").encode(),
        key.encode(),
    ):
        out = REDACTOR.data(encoded)
        assert out.count(REDACTED.encode()) == 1, (encoded, out)
    assert REDACTOR.text(f"a {key}, and {key}.") == f"a {REDACTED}, and {REDACTED}."


def test_a_key_that_holds_another_is_redacted_whole() -> None:
    redactor = Redactor(["long-key-1234", "long-key-1234-and-more"])
    assert redactor.text("long-key-1234-and-more") == REDACTED
    assert redactor.data(b"long-key-1234-and-more") == REDACTED.encode()


def test_a_short_key_is_redacted_from_errors_not_from_answers() -> None:
    short = "k" * (MIN_ANSWER_KEY - 1)
    redactor = Redactor([short])
    assert redactor.text(f"got {short}") == f"got {REDACTED}"
    assert (
        redactor.data(f'{{"kkkkkkk": "{short}"}}'.encode()) == f'{{"kkkkkkk": "{short}"}}'.encode()
    )


def test_a_stream_of_whole_events_is_never_held_back() -> None:
    redacting = REDACTOR.stream()
    event = b'data: {"choices": [{"delta": {"content": "wk-"}}]}\n\n'
    assert redacting.piece(event) == event and redacting.end() == b""
    assert redacting.piece(b"data: wk-01") == b"data: "  # may start a key: held
    assert redacting.piece(b"2") == b""
    assert redacting.piece(b"x") == b"wk-012x" and redacting.end() == b""
    assert redacting.piece(b"data: wk-0") == b"data: " and redacting.end() == b"wk-0"


_FILLER = st.sampled_from(["data: ", "x", "\n\n", '"', "\\", "w", "wk-", "01", "ck/", "é"])
_PART = st.one_of(_FILLER, st.sampled_from(KEYS), st.sampled_from([k[:5] for k in KEYS]))


@given(st.lists(_PART, max_size=30), st.lists(st.integers(0, 400), max_size=12))
def test_a_stream_cut_anywhere_is_redacted_as_the_whole_would_be(
    parts: list[str], cuts: list[int]
) -> None:
    whole = "".join(parts).encode()
    bounds = sorted({min(c, len(whole)) for c in cuts} | {0, len(whole)})
    redacting = REDACTOR.stream()
    out = b"".join(redacting.piece(whole[a:b]) for a, b in itertools.pairwise(bounds))
    out += redacting.end()
    assert out == REDACTOR.data(whole)
    assert not any(key.encode() in out for key in KEYS)


def test_a_legs_error_holds_no_key_even_as_the_exception_a_log_would_print() -> None:
    message = f"bad header: Authorization: Bearer {KEYS[0]} / {KEYS[1]}"

    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": message}}, status=400)

    async def go() -> WorkerFailedToStart:
        app = web.Application()
        app.router.add_post("/x", refuse)
        upstream = Upstream(redactor=REDACTOR)
        try:
            async with serving(app) as url:
                with pytest.raises(WorkerFailedToStart) as caught:
                    await post_json(upstream, "prefill", url + "/x", {}, {})
        finally:
            upstream.close()
        return caught.value

    error = asyncio.run(go())
    shown = " ".join((str(error), repr(error), error.detail, error.message, str(error.args)))
    assert not any(key in shown for key in KEYS), shown
    assert error.detail == f"bad header: Authorization: Bearer {REDACTED} / {REDACTED}"

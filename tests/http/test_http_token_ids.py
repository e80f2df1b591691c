"""Token ids read as bytes: the byte check says exactly what parsing says, and a reply read
from its bytes is the reply read parsed, whatever shape the worker sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import WorkerStreamError
from pd_policy_vllm.openai.plan.legs import PrefillReply, read_prefill
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.wire import codec
from pd_policy_vllm.openai.wire.token_ids import TokenIds

scalars = st.one_of(
    st.integers(0, 2**70), st.integers(-(2**40), -1), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=3),
)  # fmt: skip
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4), max_leaves=12)
#: Mostly arrays of ids, so that both answers are drawn often.
id_arrays = st.lists(st.integers(0, 2**64), max_size=6)
candidates = st.one_of(id_arrays, id_arrays, values)


def _spellings(value: Any) -> st.SearchStrategy[bytes]:
    compact = json.dumps(value, separators=(",", ":"))
    spaced = json.dumps(value, indent=1)
    # "[ ]" and "[ 1]": a strings' "[" changes too, but never makes ids of what is not.
    inside = compact.replace("[", "[ ")
    return st.sampled_from(
        [compact.encode(), spaced.encode(), f" \n{compact}\t".encode(), inside.encode()]
    )


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(type(v) is int and v >= 0 for v in value)


@given(candidates.flatmap(lambda v: st.tuples(st.just(v), _spellings(v))))
def test_the_byte_check_is_the_parsed_check(drawn: tuple[Any, bytes]) -> None:
    value, raw = drawn
    read = TokenIds.read(raw)
    event("ids" if _is_ids(value) else "not ids")
    assert (read is not None) == _is_ids(value)
    if read is not None:
        assert read == tuple(value) and len(read) == len(value) and list(read) == value
        assert json.loads(codec.dumps({"p": read})) == {"p": value}


def test_of_refuses_what_is_not_ids() -> None:
    bad_ones: list[list[Any]] = [[], [True], [-1], [1.0]]
    for bad in bad_ones:
        with pytest.raises(ValueError, match="non-negative integers"):
            TokenIds.of(bad)
    assert TokenIds.of([3, 1]) == [3, 1] and TokenIds.of((3, 1)) == TokenIds.read(b"[3, 1]")
    assert hash(TokenIds.of([3, 1])) == hash(TokenIds.read(b"[3,1]"))
    with pytest.raises(AttributeError):
        TokenIds.of([1]).json = b"[2]"


#: Replies of every shape: the fields the leg needs, right, wrong or missing, beside others.
ids_field = st.one_of(*[st.lists(st.integers(0, 2**64), min_size=1, max_size=6)] * 4, values)
_params = st.dictionaries(st.text(max_size=3), scalars, max_size=2)
params_field = st.one_of(st.none(), _params, _params, values)
usage_field = st.one_of(st.none(), st.just({"prompt_tokens": 3}), values)


@st.composite
def replies(draw: st.DrawFn) -> tuple[Any, Route]:
    fields: dict[str, Any] = {"id": "p"}
    for name, strategy in (("prompt_token_ids", ids_field), ("kv_transfer_params", params_field),
                           ("usage", usage_field)):  # fmt: skip
        if draw(st.sampled_from([True, True, True, False])):
            fields[name] = draw(strategy)
    choice = {k: v for k, v in fields.items() if k == "prompt_token_ids"}
    shape = draw(st.sampled_from(["chat", "chat", "completion", "completion", "odd"]))
    # The route the shape is for, mostly; the other one sometimes (a wrong-route reply).
    route = draw(st.sampled_from([Route.CHAT] * 3 + [Route.COMPLETIONS]))
    if shape == "completion":
        top = {k: v for k, v in fields.items() if k != "prompt_token_ids"}
        choices = draw(
            st.sampled_from(
                [
                    [choice],
                    [choice],
                    [choice],
                    [choice, 1],
                    [choice, {"prompt_token_ids": [9]}],
                    [],
                    3,
                    [7],
                ]
            )
        )
        other = Route.CHAT if route is Route.COMPLETIONS else Route.COMPLETIONS
        return {**top, "choices": choices}, other
    if shape == "odd":
        return draw(values), route
    return fields, route


def _outcome(response: Any, route: Route) -> tuple[str, Any]:
    try:
        reply = read_prefill(response, route)
    except WorkerStreamError as exc:
        return "error", (exc.status, exc.leg, exc.message)
    return "reply", (reply.prompt_token_ids.as_tuple(), reply.kv_transfer_params, reply.usage)


@given(replies())
def test_a_reply_read_from_its_bytes_is_the_reply_read_parsed(drawn: tuple[Any, Route]) -> None:
    reply, route = drawn
    raw = json.dumps(reply).encode()
    from_bytes = _outcome(raw, route)
    event(f"{route.name}: {from_bytes[0]}")
    if isinstance(reply, dict):
        assert from_bytes == _outcome(reply, route)
    else:
        # A reply that is not an object has no fields: a 502 either way.
        assert from_bytes[0] == "error"


def test_a_reply_that_is_not_json_is_the_prefills_502() -> None:
    with pytest.raises(WorkerStreamError) as caught:
        read_prefill(b'{"prompt_token_ids": [1,,2]}', Route.CHAT)
    assert caught.value.status == 502 and "not JSON" in caught.value.message


def test_the_fallback_reads_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = b'{"prompt_token_ids": [5, 6], "kv_transfer_params": {"t": 1}}'
    fast = read_prefill(raw, Route.CHAT)
    monkeypatch.setattr(codec, "USE_MSGSPEC", False)
    assert read_prefill(raw, Route.CHAT) == fast == PrefillReply((5, 6), {"t": 1}, {})
    assert json.loads(codec.dumps({"ids": fast.prompt_token_ids})) == {"ids": [5, 6]}


def test_a_completion_reply_is_read_from_its_first_choice() -> None:
    raw = b'{"choices": [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [9]}]}'
    assert read_prefill(raw, Route.COMPLETIONS).prompt_token_ids == (1, 2)


def test_the_ids_are_sent_compact() -> None:
    ids = TokenIds.read(b" [1, 22,\n 333 ] ")
    assert ids is not None and ids.json == b"[1,22,333]" and len(ids) == 3


@pytest.mark.parametrize(
    ("raw", "route"),
    [
        (b'{"prompt_token_ids": [1], "prompt_token_ids": [2, 3], "kv_transfer_params": {"a": 1},'
         b' "kv_transfer_params": {"b": 2}}', Route.CHAT),
        (b'{"choices": [{"prompt_token_ids": [1]}], "choices": [{"prompt_token_ids": [5, 6]}]}',
         Route.COMPLETIONS),
    ],
)  # fmt: skip
def test_a_key_written_twice_reads_as_parsing_reads_it(raw: bytes, route: Route) -> None:
    # JSON leaves duplicate keys to the reader; the bytes path must pick what parsing picks
    # (the last), or a worker's reply could mean two things.
    assert read_prefill(raw, route) == read_prefill(json.loads(raw), route)
    assert read_prefill(raw, route).prompt_token_ids in ((2, 3), (5, 6))

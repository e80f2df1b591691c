"""The HTTP legs, shaped from OpenAI bodies: pure functions, proved over generated bodies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    SALT_FOLD_PREFIX,
    DecodeCandidate,
    DecodeForm,
    KvConnectorMode,
    MalformedRequest,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    PrefillKv,
    Support,
    WorkerCapability,
    WorkerStreamError,
    build_decode_leg,
    ensure_kv_handoff,
    plan_kv_handoff,
    relay_kv,
)
from pd_policy_vllm.http import (
    TEXT_PART_TYPES,
    PrefillReply,
    Route,
    check_cache_salt,
    decode_body,
    media_parts,
    policy_request,
    prefill_body,
    read_prefill,
    without_media,
)
from pd_policy_vllm.openai.plan.steps import plan_request

LM_ONLY = WorkerCapability(Support.FALSE)
VISION = WorkerCapability(Support.TRUE)
NIXL = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)

text_parts = st.builds(
    lambda kind, text: {"type": kind, "text": text},
    st.sampled_from(["text", "input_text"]),
    st.text(max_size=10),
)
media = st.one_of(
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}},
              st.sampled_from(["data:image/png;base64,AA", "https://x/a.png", "data:,B"])),
    st.builds(lambda u: {"type": "video_url", "video_url": {"url": u}}, st.just("https://v")),
    st.builds(lambda u: {"type": "input_audio", "input_audio": {"data": u, "format": "wav"}},
              st.just("AAAA")),
    st.builds(lambda u, i: {"type": "image_url", "image_url": {"url": u}, "uuid": i},
              st.just("https://x/a.png"), st.text(min_size=1, max_size=5)),
)  # fmt: skip
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["user", "system", "assistant"]),
            "content": st.one_of(
                st.text(max_size=10), st.lists(st.one_of(text_parts, media), max_size=4)
            ),
        }
    ),
    min_size=1,
    max_size=3,
)
options = st.fixed_dictionaries(
    {},
    optional={
        "max_tokens": st.integers(1, 64),
        "max_completion_tokens": st.integers(1, 64),
        "stream": st.booleans(),
        "stream_options": st.just({"include_usage": True}),
        "min_tokens": st.integers(0, 4),
        "temperature": st.floats(0, 1),
        "tools": st.just([{"type": "function", "function": {"name": "f"}}]),
        "n": st.just(1),
        "cache_salt": st.text(alphabet="abc-_:", min_size=1, max_size=20),
    },
)


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    return {"model": "m", "messages": draw(messages), **draw(options)}


def has_media(body: dict[str, Any]) -> bool:
    return bool(media_parts(body))


@given(chat_bodies())
def test_the_prefill_leg_is_sanitised_as_upstream_does(body: dict[str, Any]) -> None:
    before = json.dumps(body, sort_keys=True)
    leg = prefill_body(body, Route.CHAT, NIXL)
    assert json.dumps(body, sort_keys=True) == before  # the client's body is not touched
    assert leg["stream"] is False and "stream_options" not in leg and "min_tokens" not in leg
    assert leg["return_token_ids"] is True
    assert leg["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    if "max_completion_tokens" in body:
        assert leg["max_completion_tokens"] == 1 and "max_tokens" not in leg
    else:
        assert leg["max_tokens"] == 1
    assert leg.get("n", 1) == 1
    assert leg["messages"] == body["messages"]  # the prefill keeps the media


@given(chat_bodies(), st.lists(st.integers(0, 512), min_size=1, max_size=50))
def test_a_stripped_chat_leg_forwards_ids_salt_and_kv_and_no_media(
    body: dict[str, Any], ids: list[int]
) -> None:
    request = policy_request(body, Route.CHAT, request_id="r", mrope=False)
    form, leg = build_decode_leg(request, LM_ONLY)
    assert form is DecodeForm.TEXT_PLUS_HASHES
    returned = {"do_remote_prefill": True, "transfer_id": "t"}
    leg = relay_kv(leg, returned)
    out = decode_body(body, Route.CHAT, form, leg, PrefillReply(tuple(ids), returned, {}))
    assert out.route == "/v1/chat/completions"
    decode = out.body
    # vLLM takes forwarded ids only when no part is media: none is left.
    assert not media_parts(decode)
    for message in decode["messages"]:
        content = message["content"]
        assert isinstance(content, str) or all(
            p.get("type", "text") in TEXT_PART_TYPES for p in content
        )
    assert decode["kv_transfer_params"] == {**returned, "prompt_token_ids": ids}
    # Everything but messages, kv_transfer_params and cache_salt is the client's.
    for key, value in body.items():
        if key not in {"messages", "kv_transfer_params", "cache_salt"}:
            assert decode[key] == value
    salt = decode.get("cache_salt")
    if has_media(body):
        assert salt is not None and salt.startswith(SALT_FOLD_PREFIX)
        check_cache_salt(salt)  # passes vLLM's own check
    else:
        assert salt == body.get("cache_salt")


@given(chat_bodies())
def test_the_salt_keeps_images_and_tenants_apart(body: dict[str, Any]) -> None:
    def salt(b: dict[str, Any]) -> str | None:
        request = policy_request(b, Route.CHAT, request_id="r", mrope=False)
        form, leg = build_decode_leg(request, LM_ONLY)
        reply = PrefillReply((1, 2), None, {})
        return decode_body(b, Route.CHAT, form, leg, reply).body.get("cache_salt")

    other_image = json.loads(json.dumps(body))
    other_image["messages"].append(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,Z"}}]}
    )
    other_tenant = {**other_image, "cache_salt": "another-tenant"}
    assert len({salt(body), salt(other_image), salt(other_tenant)}) == 3


def test_a_vision_worker_gets_the_original_body_with_the_kv_parameters() -> None:
    body = {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:,A"}}]}], "max_tokens": 4}  # fmt: skip
    request = policy_request(body, Route.CHAT, request_id="r", mrope=True)
    form, leg = build_decode_leg(request, VISION)
    assert form is DecodeForm.IDENTITY_ONLY
    leg = relay_kv(leg, {"transfer_id": "t"})
    out = decode_body(body, Route.CHAT, form, leg, PrefillReply((1,), {"transfer_id": "t"}, {}))
    assert out.body == {**body, "kv_transfer_params": {"transfer_id": "t"}}


def test_completions_take_the_token_ids() -> None:
    body = {"prompt": "hello there", "max_tokens": 5, "cache_salt": "tenant"}
    request = policy_request(body, Route.COMPLETIONS, request_id="r", mrope=False)
    form, leg = build_decode_leg(request, LM_ONLY)
    leg = relay_kv(leg, {"transfer_id": "t"})
    reply = read_prefill(
        {"choices": [{"prompt_token_ids": [5, 6, 7]}], "kv_transfer_params": {"transfer_id": "t"}},
        Route.COMPLETIONS,
    )
    out = decode_body(body, Route.COMPLETIONS, form, leg, reply)
    assert out.body == {**body, "prompt": [5, 6, 7], "kv_transfer_params": {"transfer_id": "t"}}
    assert out.route == "/v1/completions"


def test_the_carve_outs_apply_as_on_grpc() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:,A"}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    mrope = policy_request(body, Route.CHAT, request_id="r", mrope=True)
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        build_decode_leg(mrope, LM_ONLY)
    with pytest.raises(NSamplesOnLanguageModelOnlyDecode):
        build_decode_leg(
            policy_request({**body, "n": 2}, Route.CHAT, request_id="r", mrope=False), LM_ONLY
        )
    plain = policy_request(body, Route.CHAT, request_id="r", mrope=False)
    form, leg = build_decode_leg(plain, LM_ONLY)
    with pytest.raises(MissingKvTransferParams):
        ensure_kv_handoff(plain, form, relay_kv(leg, None), KvConnectorMode.NIXL)
    text = policy_request({"messages": [{"role": "user", "content": "hi"}]}, Route.CHAT,
                          request_id="r", mrope=True)  # fmt: skip
    form, leg = build_decode_leg(text, LM_ONLY)
    ensure_kv_handoff(text, form, leg, KvConnectorMode.NIXL)  # text recomputes


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [3]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "prompt_embeds", "data": "x"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "mystery"}]}]},
         "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": "hi"}], "n": 0}, "n"),
        ({"messages": [{"role": "user", "content": "hi"}], "cache_salt": "a/b"}, "cache_salt"),
        ({"messages": [{"role": "user", "content": "hi"}], "cache_salt": "x" * 129}, "cache_salt"),
        ({"messages": [{"role": "user", "content": "hi"}], "cache_salt": ""}, "cache_salt"),
    ],
)  # fmt: skip
def test_bad_bodies_are_typed_400s_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        policy_request(body, Route.CHAT, request_id="r", mrope=False)
    assert caught.value.status == 400 and caught.value.param == param
    assert "a/b" not in caught.value.message  # a salt is never echoed


def test_echo_with_media_is_refused_only_where_the_leg_is_stripped() -> None:
    # vLLM renders the messages again for echo, ignoring the forwarded ids: a stripped
    # leg would be answered image-blind. A vision worker's leg keeps the image.
    image = {"type": "image_url", "image_url": {"url": "data:,A"}}
    body = {"messages": [{"role": "user", "content": [image]}], "echo": True}
    text = {"messages": [{"role": "user", "content": "hi"}], "echo": True}
    kv = PrefillKv(KvConnectorMode.NIXL)

    def plan(request: dict[str, Any], worker: WorkerCapability) -> DecodeForm:
        candidates = [DecodeCandidate(worker, 0)]
        return plan_request(request, Route.CHAT, candidates, kv, mrope=False, request_id="r").form

    with pytest.raises(MalformedRequest) as caught:
        plan(body, LM_ONLY)
    assert caught.value.param == "echo"
    assert plan(body, WorkerCapability(Support.TRUE)) is DecodeForm.IDENTITY_ONLY
    assert plan(text, LM_ONLY) is DecodeForm.TEXT_PLUS_HASHES


def test_completions_serve_one_prompt() -> None:
    for prompt in (["a", "b"], [[1, 2]], None, 3):
        with pytest.raises(MalformedRequest) as caught:
            policy_request({"prompt": prompt}, Route.COMPLETIONS, request_id="r", mrope=False)
        assert caught.value.param == "prompt"


def test_a_prefill_reply_without_ids_is_a_502_naming_the_prefill() -> None:
    responses: list[dict[str, Any]] = [
        {}, {"prompt_token_ids": []}, {"prompt_token_ids": ["x"]},
        {"prompt_token_ids": [1], "kv_transfer_params": "x"},
    ]  # fmt: skip
    for response in responses:
        with pytest.raises(WorkerStreamError) as caught:
            read_prefill(response, Route.CHAT)
        assert caught.value.status == 502 and caught.value.code == "prefill_stream_error"


def test_without_media_keeps_roles_and_text() -> None:
    body = {"messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is"},
                                      {"type": "image_url", "image_url": {"url": "data:,A"}}]},
        {"role": "user", "content": [{"image_url": {"url": "data:,B"}}]},
    ]}  # fmt: skip
    assert without_media(body) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is"}]},
        {"role": "user", "content": ""},
    ]
    first, second = (
        policy_request(body, Route.CHAT, request_id="r", mrope=False).batches[0].mm_hashes
    )
    assert first != second

"""The Responses API's legs: its chat equivalent for the policy and the prefill, and the
decode leg on the client's own request."""

from __future__ import annotations

from typing import Any

import pytest

from pd_policy import (
    DecodeCandidate,
    KvConnectorMode,
    MalformedRequest,
    PrefillKv,
    Support,
    WorkerCapability,
)
from pd_policy_vllm.openai.plan.legs import Leg
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.responses import RESPONSES, chat_equivalent, responses_decode_leg
from pd_policy_vllm.openai.plan.steps import STRIPPED, decode_leg, plan_request

IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}


def responses(**extra: Any) -> dict[str, Any]:
    content = [IMAGE, {"type": "input_text", "text": "what is it?"}]
    return {"model": "tiny", "instructions": "be brief", "max_output_tokens": 5,
            "input": [{"role": "user", "content": content}], **extra}  # fmt: skip


def legs(body: dict[str, Any], worker: WorkerCapability) -> tuple[dict[str, Any], Leg]:
    chat = chat_equivalent(body)
    kv = PrefillKv(KvConnectorMode.TRANSFER)
    plan = plan_request(chat, Route.CHAT, [DecodeCandidate(worker, 0)], kv, mrope=False,
                        request_id="r")  # fmt: skip
    assert plan.prefill is not None
    reply = {
        "prompt_token_ids": [1, 2, 3],
        "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "t"},
    }
    stripped = plan.form in STRIPPED
    return plan.prefill, responses_decode_leg(body, decode_leg(plan, reply), stripped)


def test_the_chat_equivalent_renders_as_vllm_renders_the_responses_request() -> None:
    chat = chat_equivalent(responses(temperature=0))
    # In chat's own part types: vLLM's chat route validates an input_image as the openai
    # type, which needs a detail.
    assert chat["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": IMAGE["image_url"]}},
            {"type": "text", "text": "what is it?"}]},
    ]  # fmt: skip
    assert chat["temperature"] == 0 and chat["stream"] is False
    assert chat_equivalent({"input": "hi"})["messages"] == [{"role": "user", "content": "hi"}]


def test_a_language_model_only_decode_gets_the_request_without_media_and_with_the_ids() -> None:
    body = responses(cache_salt="tenant", stream=True, mm_processor_kwargs={"x": 1})
    prefill, leg = legs(body, WorkerCapability(Support.FALSE))
    assert prefill["max_tokens"] == 1 and prefill["return_token_ids"] is True
    assert prefill["messages"][1]["content"][0]["image_url"]["url"] == IMAGE["image_url"]
    assert leg.route == RESPONSES
    out = leg.body
    assert out["input"][0]["content"] == [{"type": "input_text", "text": "what is it?"}]
    assert out["kv_transfer_params"] == {
        "do_remote_prefill": True,
        "transfer_id": "t",
        "prompt_token_ids": [1, 2, 3],
    }
    assert out["cache_salt"].startswith("mm1:") and out["stream"] is True
    assert out["instructions"] == "be brief" and out["max_output_tokens"] == 5
    assert "mm_processor_kwargs" not in out
    assert body["input"][0]["content"][0] == IMAGE  # the client's body is untouched


def test_a_vision_decode_gets_the_request_itself_with_the_kv() -> None:
    body = responses()
    _, leg = legs(body, WorkerCapability(Support.TRUE))
    assert leg.body["input"] == body["input"]
    assert leg.body["kv_transfer_params"] == {"do_remote_prefill": True, "transfer_id": "t"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (responses(previous_response_id="resp_1"), "previous_response_id"),
        (responses(conversation="c"), "conversation"),
        (responses(tools=[{"type": "function", "name": "f"}]), "tools"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": "hi", "instructions": 3}, "instructions"),
        ([1], "body"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
    ],
)
def test_what_this_path_does_not_serve_is_a_typed_400(body: Any, param: str) -> None:
    with pytest.raises(MalformedRequest) as caught:
        chat_equivalent(body)
    assert caught.value.param == param and caught.value.status == 400

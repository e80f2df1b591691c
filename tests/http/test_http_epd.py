"""E/P/D over HTTP, as pure steps: render on the encoder, the encode leg, the prefill leg of
a cache consumer from the encoder's answer, and P/D's decode leg."""

from __future__ import annotations

from typing import Any

import pytest
from test_http_scale_out import (
    METADATA,
    NIXL,
    RETURNED,
    chat,
    prefill_answer,
    render_response,
)

from pd_policy import (
    DecodeCandidate,
    DecodeForm,
    MissingEncoderOutput,
    PrefillForm,
    Support,
    WorkerCapability,
)
from pd_policy_vllm.http import Route
from pd_policy_vllm.openai.plan.scale_out import GENERATE
from pd_policy_vllm.openai.plan.steps import (
    Plan,
    decode_leg,
    plan_encoded,
    plan_rendered,
    plan_request,
)

LM_ONLY = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.FALSE)


def plan(body: dict[str, Any], worker: WorkerCapability, *, mrope: bool) -> Plan[int]:
    return plan_request(
        body, Route.CHAT, [DecodeCandidate(worker, 0)], NIXL, mrope=mrope, request_id="r",
        renders=True, encodes=True,
    )  # fmt: skip


def answer(render: dict[str, Any], *, metadata: bool, skip: int = -1) -> dict[str, Any]:
    """The encoder's generate response: an entry per rendered hash (but ``skip``)."""
    hashes = render["features"]["mm_hashes"]["image"]
    meta = {"image_grid_thw": [[1, 2, 2]]} if metadata else {}
    params = {h: {"item_indices": [i], "metadata": meta}
              for i, h in enumerate(hashes) if i != skip}  # fmt: skip
    return {"request_id": "r", "choices": [], "ec_transfer_params": params}


def llava_render(images: int = 1) -> dict[str, Any]:
    render = render_response(images)
    render["features"]["mm_metadata"] = {"image": [None] * images}  # LLaVA publishes none
    return render


def test_a_qwen_image_renders_on_the_encoder_then_prefills_without_pixels() -> None:
    planned = plan(chat(images=2), METADATA, mrope=True)
    assert planned.epd and planned.render == chat(images=2) and planned.prefill is None
    render = render_response(images=2)
    planned = plan_rendered(planned, render)
    assert planned.encode is not None and planned.prefill is None
    encode = planned.encode
    assert encode["features"]["kwargs_data"] == render["features"]["kwargs_data"]  # pixels
    assert encode["sampling_params"]["max_tokens"] == 1 and encode["kv_transfer_params"] is None
    planned = plan_encoded(planned, answer(render, metadata=True))
    assert planned.prefill_form is PrefillForm.METADATA and planned.encode is None
    prefill = planned.prefill
    assert prefill is not None
    assert "kwargs_data" not in prefill["features"]  # no pixel reaches the prefill
    assert prefill["features"]["mm_metadata"] == render["features"]["mm_metadata"]
    assert list(prefill["ec_transfer_params"]) == render["features"]["mm_hashes"]["image"]
    assert prefill["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    leg = decode_leg(planned, prefill_answer(render))
    assert leg.route == GENERATE and planned.form is DecodeForm.MROPE_METADATA
    assert leg.body["features"]["kwargs_data"] == render["features"]["mm_metadata"]
    assert leg.body["kv_transfer_params"] == RETURNED


def test_a_llava_image_keeps_its_pixels_to_the_prefill_and_decodes_as_text() -> None:
    planned = plan(chat(), LM_ONLY, mrope=False)
    render = llava_render()
    planned = plan_rendered(planned, render)
    assert planned.form is DecodeForm.TEXT_PLUS_HASHES
    planned = plan_encoded(planned, answer(render, metadata=False))
    assert planned.prefill_form is PrefillForm.IMAGE
    assert planned.prefill is not None
    assert planned.prefill["features"]["kwargs_data"] == render["features"]["kwargs_data"]
    assert planned.prefill["ec_transfer_params"]
    leg = decode_leg(planned, prefill_answer(render))
    assert leg.route == Route.CHAT.value  # P/D's stripped chat leg
    assert leg.body["kv_transfer_params"]["prompt_token_ids"] == render["token_ids"]


@pytest.mark.parametrize("missing", [0, 1])
def test_an_item_the_encoder_did_not_answer_for_sends_no_prefill(missing: int) -> None:
    render = render_response(images=2)
    planned = plan_rendered(plan(chat(images=2), METADATA, mrope=True), render)
    with pytest.raises(MissingEncoderOutput) as caught:
        plan_encoded(planned, answer(render, metadata=True, skip=missing))
    assert caught.value.status == 502 and not caught.value.retryable
    assert caught.value.param == f"batches[0].mm_hashes[{missing}]"


@pytest.mark.parametrize("reply", [{}, {"ec_transfer_params": None}, {"ec_transfer_params": []}])
def test_an_encoder_answer_without_outputs_sends_no_prefill(reply: dict[str, Any]) -> None:
    render = render_response()
    planned = plan_rendered(plan(chat(), METADATA, mrope=True), render)
    with pytest.raises(MissingEncoderOutput):
        plan_encoded(planned, reply)


def test_text_and_n_samples_take_p_d_s_path() -> None:
    text = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert not plan(text, LM_ONLY, mrope=False).epd
    vision = WorkerCapability(Support.TRUE)
    planned = plan(chat(n=2), vision, mrope=True)
    assert not planned.epd and planned.form is DecodeForm.FULL

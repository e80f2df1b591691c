"""The M-RoPE metadata path over HTTP: render, a whole prefill, a metadata-only decode,
derender. Pure steps, proved over generated renders."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from pd_policy import (
    DecodeCandidate,
    DecodeForm,
    KvConnectorMode,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    PrefillKv,
    Support,
    WorkerCapability,
    WorkerStreamError,
)
from pd_policy_vllm.http import Route
from pd_policy_vllm.openai.plan.scale_out import DERENDER, GENERATE, read_render
from pd_policy_vllm.openai.plan.steps import decode_leg, plan_rendered, plan_request

LM_ONLY = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.FALSE)
METADATA = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
VISION = WorkerCapability(Support.TRUE)
NIXL = PrefillKv(KvConnectorMode.TRANSFER)  # tagged as NIXL is; names a transfer id
RETURNED = {"do_remote_prefill": True, "transfer_id": "t-1"}


def image(n: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:image/png;base64,IMG{n}"}}


def chat(images: int = 1, **extra: Any) -> dict[str, Any]:
    parts = [*(image(i) for i in range(images)), {"type": "text", "text": "what is it?"}]
    return {"model": "m", "messages": [{"role": "user", "content": parts}], "max_tokens": 7,
            "temperature": 0, **extra}  # fmt: skip


def render_response(
    images: int = 1, pixels: int = 64, ids: int = 40, **extra: Any
) -> dict[str, Any]:
    """A render answer as vLLM 0.32 gives it: each image 4 placeholder ids from offset 2."""
    places = [{"offset": 2 + 4 * i, "length": 4} for i in range(images)]
    features = {
        "mm_hashes": {"image": [f"{i:064x}" for i in range(1, images + 1)]},
        "mm_placeholders": {"image": places},
        "kwargs_data": {"image": [f"PIXELS{i}" + "P" * pixels for i in range(images)]},
        "mm_metadata": {"image": [f"GRID{i}" for i in range(images)]},
    }
    return {"request_id": "r", "token_ids": list(range(7, 7 + max(ids, 4 * images + 2))),
            "features": features, "model": "m", "stream": False, "cache_salt": None,
            "sampling_params": {"max_tokens": 7, "temperature": 0.0, "n": 1},
            "kv_transfer_params": None, **extra}  # fmt: skip


def candidates(*workers: WorkerCapability) -> list[DecodeCandidate[int]]:
    return [DecodeCandidate(w, i) for i, w in enumerate(workers)]


def plan(body: dict[str, Any], *workers: WorkerCapability, renders: bool = True) -> Any:
    return plan_request(
        body, Route.CHAT, candidates(*workers), NIXL, mrope=True, request_id="r",
        renders=renders,
    )  # fmt: skip


def through(body: dict[str, Any], render: dict[str, Any], prefill: dict[str, Any]) -> Any:
    planned = plan_rendered(plan(body, METADATA), render)
    return planned, decode_leg(planned, prefill)


def prefill_answer(render: dict[str, Any], kv: Any = RETURNED) -> dict[str, Any]:
    return {"prompt_token_ids": render["token_ids"], "kv_transfer_params": kv, "choices": []}


def test_an_m_rope_image_to_a_metadata_worker_renders_first_and_calls_no_one_else() -> None:
    planned = plan(chat(), LM_ONLY, METADATA)
    assert planned.form is DecodeForm.MROPE_METADATA
    assert planned.decode.handle == 1  # the worker that can serve it
    assert planned.render == chat() and planned.prefill is None


def test_without_the_render_route_there_is_no_metadata_path() -> None:
    with pytest.raises(MropeOnLanguageModelOnlyDecode) as caught:
        plan(chat(), METADATA, renders=False)
    assert caught.value.param == "input_ids"


@pytest.mark.parametrize(
    ("body", "error"),
    [(chat(n=2), NSamplesOnLanguageModelOnlyDecode), (chat(), MropeOnLanguageModelOnlyDecode)],
)
def test_refusals_come_before_the_render(body: dict[str, Any], error: type[Exception]) -> None:
    workers = (METADATA,) if error is NSamplesOnLanguageModelOnlyDecode else (LM_ONLY,)
    with pytest.raises(error):
        plan(body, *workers)


def test_a_vision_worker_takes_the_chat_path_unrendered() -> None:
    planned = plan(chat(), VISION)
    assert planned.render is None and planned.prefill_route == Route.CHAT.value
    assert planned.form is DecodeForm.IDENTITY_ONLY


def test_the_prefill_leg_is_the_rendered_request_whole_for_one_token() -> None:
    render = render_response(2)
    planned = plan_rendered(plan(chat(2), METADATA), render)
    leg = planned.prefill
    assert leg is not None
    assert planned.prefill_route == GENERATE and planned.render is None
    assert leg["features"] == render["features"]  # pixels: the prefill encodes them, once
    assert leg["sampling_params"] == {"max_tokens": 1, "temperature": 0.0, "n": 1, "min_tokens": 0}
    assert leg["stream"] is False and leg["return_token_ids"] is True
    assert leg["kv_transfer_params"]["do_remote_decode"] is True


@given(
    images=st.integers(1, 4),
    pixels=st.sampled_from([0, 1_000, 100_000]),
    stream=st.booleans(),
    salt=st.none() | st.sampled_from(["tenant-a", "b"]),
)
def test_the_decode_leg_carries_metadata_and_kv_and_never_pixels(
    images: int, pixels: int, stream: bool, salt: str | None
) -> None:
    event(f"images: {images}")
    body = chat(images, stream=stream, **({"cache_salt": salt} if salt else {}))
    render = render_response(images, pixels, stream=stream, cache_salt=salt)
    _, leg = through(body, render, prefill_answer(render))
    sent = json.dumps(leg.body)
    assert leg.route == GENERATE and "PIXELS" not in sent and "IMG" not in sent
    features = leg.body["features"]
    assert features["kwargs_data"] == {"image": [f"GRID{i}" for i in range(images)]}
    assert features["mm_hashes"] == render["features"]["mm_hashes"]
    assert features["mm_placeholders"] == render["features"]["mm_placeholders"]
    assert leg.body["token_ids"] == render["token_ids"]
    assert leg.body["kv_transfer_params"] == RETURNED
    # The client's sampling and stream as rendered; vLLM keys blocks by the hashes, so the
    # caller's salt is kept as is.
    assert leg.body["sampling_params"]["max_tokens"] == 7 and leg.body["stream"] is stream
    assert leg.body["cache_salt"] == salt
    assert leg.derender is not None and leg.derender.route == DERENDER
    chat_request = leg.derender.template["chat_request"]
    assert "IMG" not in json.dumps(chat_request) and chat_request["max_tokens"] == 7


def test_the_decode_leg_does_not_grow_with_the_pixels() -> None:
    sizes = []
    for pixels in (0, 1 << 20):
        render = render_response(2, pixels)
        sizes.append(len(json.dumps(through(chat(2), render, prefill_answer(render))[1].body)))
    assert sizes[0] == sizes[1]


def test_no_kv_handed_over_is_a_502_never_a_decode() -> None:
    render = render_response()
    with pytest.raises(MissingKvTransferParams):
        through(chat(), render, prefill_answer(render, kv=None))


def test_prefill_ids_that_are_not_the_rendered_ones_are_a_502() -> None:
    render = render_response()
    answer = {**prefill_answer(render), "prompt_token_ids": [1, 2, 3]}
    with pytest.raises(WorkerStreamError) as caught:
        through(chat(), render, answer)
    assert caught.value.code == "prefill_stream_error" and caught.value.status == 502


def _broken(change: str) -> dict[str, Any]:
    render = render_response(2)
    features = render["features"]
    if change == "no ids":
        render["token_ids"] = []
    elif change == "no features":
        render["features"] = None
    elif change == "a grid missing":
        features["mm_metadata"] = {"image": ["GRID0", None]}
    elif change == "no metadata":
        del features["mm_metadata"]
    elif change == "a hash missing":
        features["mm_hashes"]["image"][1] = ""
    elif change == "a bad placeholder":
        features["mm_placeholders"]["image"][0] = {"offset": 2}
    elif change == "a placeholder past the ids":
        features["mm_placeholders"]["image"][1] = {"offset": 10_000, "length": 4}
    elif change == "an unknown modality":
        for key in ("mm_hashes", "mm_placeholders", "mm_metadata"):
            features[key]["smell"] = features[key].pop("image")
    elif change == "no items":
        for key in ("mm_hashes", "mm_placeholders", "mm_metadata"):
            features[key] = {}
    elif change == "lists that are not lists":
        features["mm_hashes"] = {"image": "abc"}
    return render


@pytest.mark.parametrize(
    "change",
    ["no ids", "no features", "a grid missing", "no metadata", "a hash missing",
     "a bad placeholder", "a placeholder past the ids", "an unknown modality", "no items",
     "lists that are not lists"],
)  # fmt: skip
def test_a_render_that_does_not_say_what_decode_needs_is_a_502(change: str) -> None:
    with pytest.raises(WorkerStreamError) as caught:
        plan_rendered(plan(chat(2), METADATA), _broken(change))
    assert (caught.value.status, caught.value.code) == (502, "prefill_stream_error")
    assert "render response" in caught.value.message


def test_read_render_reads_what_vllm_sends() -> None:
    rendered = read_render(render_response(2))
    assert rendered.metadata == {"image": ["GRID0", "GRID1"]}
    assert rendered.token_ids[0] == 7


def test_the_derender_calls_carry_the_prompt_and_the_output() -> None:
    render = render_response()
    _, leg = through(chat(stream=True, stream_options={"include_usage": True}), render,
                     prefill_answer(render))  # fmt: skip
    assert leg.derender is not None
    whole = leg.derender.whole({"choices": [{"token_ids": [5]}]})
    assert whole["stream"] is False and whole["generate_response"]["choices"][0]["token_ids"]
    assert whole["prompt_token_ids"] == render["token_ids"]
    assert whole["prompt_tokens"] == len(render["token_ids"])
    assert (
        whole["chat_request"]["stream"] is False and "stream_options" not in whole["chat_request"]
    )
    chunk = leg.derender.chunk({"choices": []}, {"s": 1})
    assert chunk["stream"] is True and chunk["stream_state"] == {"s": 1}
    assert chunk["chat_request"]["stream"] is True


def test_the_client_gets_the_prompt_ids_it_asked_for_which_the_derender_leaves_out() -> None:
    render = render_response()
    _, leg = through(chat(return_token_ids=True), render, prefill_answer(render))
    assert leg.derender is not None
    # vLLM 0.32's derender answers "prompt_token_ids": null; a plain server sends the ids.
    filled = leg.derender.with_prompt_ids({"choices": [], "prompt_token_ids": None})
    assert filled["prompt_token_ids"] == render["token_ids"]
    assert leg.derender.with_prompt_ids({"prompt_token_ids": [9]}) == {"prompt_token_ids": [9]}
    _, plain = through(chat(), render, prefill_answer(render))
    assert plain.derender is not None
    assert plain.derender.with_prompt_ids({"prompt_token_ids": None}) == {"prompt_token_ids": None}

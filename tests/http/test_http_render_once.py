"""Render once, as pure steps: which plans send their prefill leg as token-in from a render
the router holds, what that leg is, and that the decode leg does not change with it."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_http_scale_out import RETURNED, chat, render_response

from pd_policy import (
    DecodeCandidate,
    KvConnectorMode,
    PolicyError,
    PrefillKv,
    Support,
    WorkerCapability,
)
from pd_policy_vllm.http import Route
from pd_policy_vllm.openai.plan.render_once import (
    plan_render_once,
    read_prompt,
    render_tensors,
    takes_render,
)
from pd_policy_vllm.openai.plan.responses import RESPONSES
from pd_policy_vllm.openai.plan.scale_out import GENERATE
from pd_policy_vllm.openai.plan.steps import Plan, decode_leg, plan_request

LM_ONLY = WorkerCapability(Support.FALSE)
VISION = WorkerCapability(Support.TRUE)
CHAT = Route.CHAT.value
MODES = list(KvConnectorMode)


def plan(
    body: dict[str, Any],
    worker: WorkerCapability = LM_ONLY,
    mode: KvConnectorMode = KvConnectorMode.TRANSFER,
    route: Route = Route.CHAT,
) -> Plan[int]:
    kv = PrefillKv(mode, bootstrap_host="h" if mode is KvConnectorMode.MOONCAKE else None)
    return plan_request(body, route, [DecodeCandidate(worker, 0)], kv, mrope=False, request_id="r")


def llava(images: int = 1, **extra: Any) -> dict[str, Any]:
    """A LLaVA render answer: every image's processed tensors, no metadata-only item."""
    render = render_response(images, **extra)
    render["features"]["mm_metadata"] = None
    return render


def once(planned: Plan[int], answer: Any, decode_route: str = CHAT) -> Plan[int]:
    return plan_render_once(planned, answer, decode_route=decode_route, serves_generate=True)


def generated(answer: Any) -> dict[str, Any]:
    """What the prefill's generate route answers for a render ``answer``."""
    ids = (answer[0] if isinstance(answer, list) else answer)["token_ids"]
    return {"request_id": "r", "choices": [], "prompt_token_ids": ids,
            "kv_transfer_params": RETURNED}  # fmt: skip


@given(images=st.integers(1, 3), salt=st.none() | st.just("tenant-a"), vision=st.booleans())
def test_the_prefill_leg_is_the_render_whole_and_the_decode_leg_is_unchanged(
    images: int, salt: str | None, vision: bool
) -> None:
    body = chat(images, **({"cache_salt": salt} if salt else {}))
    render = llava(images, cache_salt=salt)
    today = plan(body, VISION if vision else LM_ONLY)
    taken = once(today, render)
    leg = taken.prefill
    assert leg is not None and taken.prefill_route == GENERATE
    assert leg["token_ids"] == render["token_ids"] and leg["features"] == render["features"]
    assert leg["cache_salt"] == salt  # the prefill names its blocks as it did
    assert leg["sampling_params"]["max_tokens"] == 1 and leg["stream"] is False
    assert leg["return_token_ids"] is True
    assert leg["kv_transfer_params"] == {"do_remote_decode": True, "do_remote_prefill": False}
    # The form, the request and the handoff are the plan's: the decode leg, its salt and
    # its identities, is the one the chat prefill leg would have led to.
    assert (taken.form, taken.request, taken.leg) == (today.form, today.request, today.leg)
    chat_answer = {**generated(render), "choices": [{"index": 0}]}
    assert decode_leg(taken, generated(render)) == decode_leg(today, chat_answer)


def test_a_text_request_and_a_completions_prompt_are_token_in_too() -> None:
    text = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    rendered = {"request_id": "r", "token_ids": [1, 2, 3], "features": None,
                "sampling_params": {"max_tokens": 3}, "cache_salt": None}  # fmt: skip
    taken = once(plan(text), rendered)
    assert taken.prefill_route == GENERATE and taken.prefill is not None
    assert "features" in taken.prefill and taken.prefill["features"] is None
    prompt = {"model": "m", "prompt": "once upon", "max_tokens": 3}
    completions = plan(prompt, route=Route.COMPLETIONS)
    taken = once(completions, [rendered], Route.COMPLETIONS.value)  # a list of one prompt
    assert taken.prefill is not None and taken.prefill["token_ids"] == [1, 2, 3]
    leg = decode_leg(taken, generated([rendered]))
    assert leg.route == Route.COMPLETIONS.value and leg.body["prompt"] == [1, 2, 3]


@pytest.mark.parametrize("decode_route", [CHAT, Route.COMPLETIONS.value, RESPONSES])
def test_nixl_push_keeps_the_prefill_leg_on_the_decode_legs_route(decode_route: str) -> None:
    # Push pairs the legs by request id and route: a generate prefill leg would never be
    # matched by the decode's chat leg.
    push = plan(chat(), mode=KvConnectorMode.NIXL_PUSH)
    assert not takes_render(push, decode_route=decode_route, serves_generate=True)
    assert once(push, llava(), decode_route) is push
    assert push.prefill_route == CHAT
    # A decode leg on the generate route too (the metadata path's) would be matched.
    assert takes_render(push, decode_route=GENERATE, serves_generate=True)


@pytest.mark.parametrize("mode", [m for m in MODES if not m.legs_share_route])
def test_every_connector_that_lets_the_legs_part_takes_the_render(mode: KvConnectorMode) -> None:
    taken = once(plan(chat(), mode=mode), llava())
    assert taken.prefill_route == GENERATE and taken.prefill is not None
    # Tagged for its connector as the chat leg is (Mooncake: the minted transfer).
    tag = taken.handoff.prefill_params
    assert taken.prefill["kv_transfer_params"] == (json.loads(tag) if tag is not None else None)


def test_no_prefill_a_render_of_its_own_an_uncached_item_or_no_generate_route_keep_the_form() -> (
    None
):
    two = plan(chat(n=2), VISION)  # n > 1: the decode runs alone
    assert two.prefill is None and not takes_render(two, decode_route=CHAT, serves_generate=True)
    metadata = plan_request(
        chat(), Route.CHAT,
        [DecodeCandidate(WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE), 0)],
        PrefillKv(KvConnectorMode.TRANSFER), mrope=True, request_id="r", renders=True,
    )  # fmt: skip
    assert metadata.render is not None
    assert not takes_render(metadata, decode_route=GENERATE, serves_generate=True)
    remote = chat()
    remote["messages"][0]["content"][0]["image_url"]["url"] = "http://203.0.113.5/a.png"
    uncached = plan(remote, VISION)
    assert uncached.uncached
    assert once(uncached, llava()) is uncached
    served = plan(chat())
    assert plan_render_once(served, llava(), decode_route=CHAT, serves_generate=False) is served


def _without_tensors(render: dict[str, Any]) -> None:
    render["features"]["kwargs_data"] = None  # mm_payload: "none"


def _one_without(render: dict[str, Any]) -> None:
    render["features"]["kwargs_data"]["image"][1] = None  # "in the cache"


def _one_short(render: dict[str, Any]) -> None:
    render["features"]["kwargs_data"]["image"].pop()


def _media_of_its_own(render: dict[str, Any]) -> None:
    render["content_parts"] = [{"type": "image_url", "url": "data:image/png;base64,AAAA"}]


def _no_ids(render: dict[str, Any]) -> None:
    render["token_ids"] = None


@pytest.mark.parametrize(
    "change", [_without_tensors, _one_without, _one_short, _media_of_its_own, _no_ids]
)
def test_a_render_the_prefill_could_not_take_whole_is_refused_for_the_caller_to_keep_its_plan(
    change: Any,
) -> None:
    render = llava(2)
    change(render)
    with pytest.raises(PolicyError) as caught:
        once(plan(chat(2)), render)
    assert caught.value.status == 502
    with pytest.raises(PolicyError):
        read_prompt([llava(2), llava(2)])  # two prompts
    with pytest.raises(PolicyError):
        read_prompt("token_ids")


def test_the_rendered_ids_are_checked_against_the_prefills() -> None:
    render = llava()
    taken = once(plan(chat()), render)
    wrong = copy.deepcopy(generated(render))
    wrong["prompt_token_ids"] = wrong["prompt_token_ids"][:-1]
    with pytest.raises(PolicyError) as caught:
        decode_leg(taken, wrong)
    assert caught.value.status == 502


@pytest.mark.parametrize("mrope", [False, True])
def test_a_lookup_asks_for_tensors_only_when_a_plan_may_take_them(mrope: bool) -> None:
    pull, push = KvConnectorMode.NIXL, KvConnectorMode.NIXL_PUSH
    assert render_tensors(mrope=mrope, render_once=True, modes=[pull])
    assert render_tensors(mrope=mrope, render_once=True, modes=[push, pull])
    # Only push prefills (their legs share a route), or render once off: the metadata
    # path alone takes a render over.
    assert render_tensors(mrope=mrope, render_once=True, modes=[push]) is mrope
    assert render_tensors(mrope=mrope, render_once=False, modes=[pull]) is mrope
    assert render_tensors(mrope=mrope, render_once=True, modes=[]) is mrope

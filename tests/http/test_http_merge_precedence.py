"""Which value wins where a leg merges the client's body with what the policy sets.

A leg is the client's body with some keys rewritten. For each rewritten key the client
may send its own value, and the policy's must win: the handoff's tag on the prefill, the
prefill's expanded ids over ids the relayed KV parameters happen to carry, the folded
salt over the client's. An equality property between two paths cannot pin this (both
could merge the wrong way); these tests do, one key each.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pd_policy import (
    DecodeCandidate,
    KvConnectorMode,
    PrefillKv,
    VisionSupport,
    WorkerCapability,
)
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.steps import decode_leg, plan_request
from pd_policy_vllm.openai.wire import codec

LM_ONLY = WorkerCapability(VisionSupport.FALSE)
VISION = WorkerCapability(VisionSupport.TRUE)
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}}
EXPANDED = [7, 8, 9, 9, 9, 10]


def _chat(**extra: Any) -> dict[str, Any]:
    content = [IMAGE, {"type": "text", "text": "what is it?"}]
    return {"model": "m", "messages": [{"role": "user", "content": content}], **extra}


def _legs(
    body: dict[str, Any], route: Route = Route.CHAT, worker: WorkerCapability = LM_ONLY,
    reply: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """The prefill leg and the decode leg (as the worker reads them, from their bytes)."""
    plan = plan_request(
        body, route, [DecodeCandidate(worker, 0)], PrefillKv(KvConnectorMode.TRANSFER),
        mrope=False, request_id="r",
    )  # fmt: skip
    assert plan.prefill is not None
    if reply is None:
        reply = {
            "prompt_token_ids": EXPANDED,
            "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": "t"},
        }
    if route is Route.COMPLETIONS:
        ids = reply.pop("prompt_token_ids")
        reply = {**reply, "choices": [{"prompt_token_ids": ids}]}
    leg = decode_leg(plan, json.dumps(reply).encode())
    return codec.loads(codec.dumps(plan.prefill)), codec.loads(codec.dumps(leg.body))


def test_the_prefills_expanded_ids_win_over_ids_the_relayed_parameters_carry() -> None:
    reply = {
        "prompt_token_ids": EXPANDED,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "transfer_id": "t",
            "prompt_token_ids": [1, 2],
        },
    }
    _, decode = _legs(_chat(), reply=reply)
    assert decode["kv_transfer_params"] == {
        "do_remote_prefill": True,
        "transfer_id": "t",
        "prompt_token_ids": EXPANDED,
    }


def test_the_relayed_parameters_win_over_the_clients() -> None:
    _, decode = _legs(_chat(kv_transfer_params={"transfer_id": "the client's"}))
    assert decode["kv_transfer_params"]["transfer_id"] == "t"
    _, full = _legs(_chat(kv_transfer_params={"transfer_id": "the client's"}), worker=VISION)
    assert full["kv_transfer_params"] == {"do_remote_prefill": True, "transfer_id": "t"}


def test_the_folded_salt_wins_over_the_clients() -> None:
    _, decode = _legs(_chat(cache_salt="mine"))
    assert decode["cache_salt"] != "mine" and len(decode["cache_salt"]) == 68
    _, other = _legs(_chat(cache_salt="theirs"))
    assert other["cache_salt"] != decode["cache_salt"]  # the caller's salt is folded in


def test_completions_the_expanded_ids_win_over_the_clients_prompt() -> None:
    body = {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5}
    prefill, stripped = _legs(body, Route.COMPLETIONS, worker=LM_ONLY)
    assert stripped["prompt"] == EXPANDED  # a language-model-only decode: the prefill's ids
    assert prefill["max_tokens"] == 1 and stripped["max_tokens"] == 5
    _, full = _legs(body, Route.COMPLETIONS, worker=VISION)
    assert full["prompt"] == [1, 2, 3]  # a full leg is the client's request


@pytest.mark.parametrize(
    ("key", "client", "policy"),
    [
        ("stream", True, False),
        ("max_tokens", 64, 1),
        ("n", 1, 1),
        ("return_token_ids", False, True),
        ("kv_transfer_params", {"do_remote_decode": False, "x": 1},
         {"do_remote_decode": True, "do_remote_prefill": False}),
    ],
)  # fmt: skip
def test_the_prefill_leg_sets_its_own_value_whatever_the_client_sent(
    key: str, client: Any, policy: Any
) -> None:
    prefill, decode = _legs(_chat(**{key: client}))
    assert prefill[key] == policy
    if key in ("max_tokens", "stream"):
        assert decode[key] == client  # the decode leg is the client's request


def test_the_prefill_cap_goes_on_the_key_the_client_used() -> None:
    prefill, _ = _legs(_chat(max_completion_tokens=64))
    assert prefill["max_completion_tokens"] == 1 and "max_tokens" not in prefill
    prefill, _ = _legs(_chat(max_tokens=64, max_completion_tokens=64))
    assert prefill["max_completion_tokens"] == 1 and "max_tokens" not in prefill


def test_the_prefill_leg_drops_what_only_a_stream_or_many_samples_use() -> None:
    prefill, _ = _legs(_chat(stream=True, stream_options={"include_usage": True}, min_tokens=3))
    assert "stream_options" not in prefill and "min_tokens" not in prefill

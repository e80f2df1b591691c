"""The Ray adapter's legs, from the core's plan (pure: no Ray, no engine)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from pd_policy import (
    NIXL_PREFILL_PARAMS,
    InvalidConfiguration,
    KvConnectorMode,
    MissingKvTransferParams,
    PolicyError,
    PrefillKv,
    Support,
    WorkerCapability,
)
from pd_policy.catalog import ERROR_CATALOG
from pd_policy_ray.errors import error_fields
from pd_policy_ray.legs import decode_body_for, plan_legs, prefill_body_for, prefill_kv
from pd_policy_vllm.http.request import Route

LM_ONLY = WorkerCapability(Support.FALSE)
VISION = WorkerCapability(Support.TRUE)
NIXL = PrefillKv(KvConnectorMode.NIXL)
IDS = [1, 2, 3] + [32000] * 36 + [4, 5]
RELAYED = {"transfer_id": "t1", "do_remote_prefill": True}


def chat(url: str = "data:image/png;base64,AAAA", **extra: Any) -> dict[str, Any]:
    return {
        "model": "llava", "max_tokens": 5, "temperature": 0,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]}],
        **extra,
    }  # fmt: skip


def reply(kv: Any = RELAYED) -> dict[str, Any]:
    # As Ray's prefill server answers (model_dump of vLLM's chat response).
    return {"id": "p", "choices": [{"index": 0, "message": {"content": "x"}}],
            "prompt_token_ids": IDS, "kv_transfer_params": kv, "usage": {}}  # fmt: skip


def plan(body: dict[str, Any], capability: WorkerCapability = LM_ONLY, **kw: Any) -> Any:
    return plan_legs(body, Route.CHAT, capability, NIXL, mrope=kw.pop("mrope", False),
                     request_id="r1", **kw)  # fmt: skip


def test_prefill_leg_keeps_the_image_and_asks_for_one_token_and_the_ids() -> None:
    leg = prefill_body_for(plan(chat(stream=True)))
    assert leg is not None
    assert leg["messages"] == chat()["messages"]
    assert (leg["max_tokens"], leg["stream"], leg["return_token_ids"]) == (1, False, True)
    assert leg["kv_transfer_params"] == json.loads(NIXL_PREFILL_PARAMS)


def test_lm_only_decode_leg_has_no_media_and_carries_ids_kv_and_salt() -> None:
    legs = plan(chat())
    leg = decode_body_for(legs, reply())
    assert leg["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "what is it?"}]}
    ]
    assert leg["kv_transfer_params"] == {**RELAYED, "prompt_token_ids": IDS}
    assert leg["cache_salt"].startswith("mm1:")
    assert leg["max_tokens"] == 5
    json.dumps(leg)  # plain JSON types: pydantic and pickling take it


def test_different_images_get_different_salts() -> None:
    a = decode_body_for(plan(chat("data:image/png;base64,AAAA")), reply())
    b = decode_body_for(plan(chat("data:image/png;base64,BBBB")), reply())
    again = decode_body_for(plan(chat("data:image/png;base64,AAAA")), reply())
    assert a["cache_salt"] != b["cache_salt"]
    assert a["cache_salt"] == again["cache_salt"]


def test_vision_decode_leg_is_the_body_with_the_relayed_kv() -> None:
    leg = decode_body_for(plan(chat(), VISION), reply())
    assert leg["messages"] == chat()["messages"]
    assert leg["kv_transfer_params"] == RELAYED


def test_stripped_leg_without_kv_is_a_502() -> None:
    with pytest.raises(MissingKvTransferParams) as caught:
        decode_body_for(plan(chat()), reply(kv=None))
    assert caught.value.status == 502


@pytest.mark.parametrize(
    ("body", "code", "status"),
    [
        (chat(n=2), "pd_decode_language_model_only_n_samples", 400),
        (chat("file:///etc/passwd"), "pd_media_refused", 400),
        (chat(cache_salt=["a"]), "pd_invalid_request", 400),
        ({"model": "m", "messages": "nope"}, "pd_invalid_request", 400),
    ],
)
def test_refusals_before_any_engine(body: dict[str, Any], code: str, status: int) -> None:
    with pytest.raises(PolicyError) as caught:
        plan(body)
    assert (caught.value.code, caught.value.status) == (code, status)


def test_mrope_image_on_lm_only_decode_is_refused_before_any_engine() -> None:
    # A replica that takes metadata would need the prefill's render, which Ray's
    # prefill server does not serve: the core names what is missing.
    takes_metadata = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
    for capability, param in ((LM_ONLY, None), (takes_metadata, "input_ids")):
        with pytest.raises(PolicyError) as caught:
            plan(chat(), capability, mrope=True)
        assert caught.value.code == "pd_decode_language_model_only_mrope"
        assert (caught.value.status, caught.value.param) == (400, param)


def test_text_request_on_lm_only_decode_runs_pd_without_a_salt() -> None:
    body = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    leg = decode_body_for(plan(body), reply())
    assert "cache_salt" not in leg
    assert leg["messages"] == body["messages"]


def test_prefill_kv_reads_the_connector() -> None:
    assert prefill_kv({"kv_connector": "TransferConnector"}).mode is KvConnectorMode.NIXL
    assert prefill_kv({"kv_connector": "NixlConnector"}).mode is KvConnectorMode.NIXL
    for config in (None, {}, {"kv_connector": ""}, {"kv_connector": "Else"}, {"kv_connector": 3}):
        with pytest.raises(InvalidConfiguration):
            prefill_kv(config)


def test_error_fields_lead_with_the_code_and_carry_the_status() -> None:
    with pytest.raises(PolicyError) as caught:
        plan(chat(n=2))
    fields = error_fields(caught.value)
    assert fields["message"].startswith("pd_decode_language_model_only_n_samples: ")
    assert fields["code"] == 400
    assert fields["type"] == caught.value.error_type


def test_n_above_one_without_media_runs_decode_alone() -> None:
    body = {"model": "m", "n": 2, "messages": [{"role": "user", "content": "hi"}]}
    legs = plan(body)
    assert prefill_body_for(legs) is None
    assert decode_body_for(legs, None)["n"] == 2


def test_the_error_table_of_the_ray_guide_agrees_with_the_catalog() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "ray.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| [^|]+ \| (\d{3}) \| `([a-z_0-9]+)` \|$", guide, flags=re.MULTILINE)
    assert len(rows) == 4, rows
    for status, code in rows:
        assert ERROR_CATALOG[code].status == int(status), code

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
from pd_policy_ray.legs import (
    decode_body_for,
    decode_leg_for,
    plan_legs,
    prefill_body_for,
    prefill_kv,
    rendered_plan,
)
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.scale_out import GENERATE

LM_ONLY = WorkerCapability(Support.FALSE)
VISION = WorkerCapability(Support.TRUE)
NIXL = PrefillKv(KvConnectorMode.TRANSFER)  # tagged as NIXL is; RELAYED names its transfer
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


TAKES_METADATA = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)


def render(grids: bool = True, **features: Any) -> dict[str, Any]:
    """A render answer as vLLM 0.32's ``ServingRender`` dumps it: one image, 36
    placeholder ids from offset 3, its pixels and grid whole and its grid alone."""
    found = {
        "mm_hashes": {"image": ["ab" * 32]},
        "mm_placeholders": {"image": [{"offset": 3, "length": 36}]},
        "kwargs_data": {"image": ["PIXELS-AND-GRID"]},
        "mm_metadata": {"image": ["GRID-ONLY"]} if grids else None,
        **features,
    }
    return {"request_id": "r1", "token_ids": IDS, "features": found, "model": "qwen",
            "stream": False, "sampling_params": {"max_tokens": 5, "temperature": 0.0, "n": 1},
            "cache_salt": None, "kv_transfer_params": None}  # fmt: skip


def generated(kv: Any = RELAYED, ids: list[int] = IDS) -> dict[str, Any]:
    # As the prefill replica's token-in generate answers (its model_dump).
    return {"request_id": "r1", "choices": [{"index": 0, "token_ids": [9]}],
            "prompt_token_ids": ids, "kv_transfer_params": kv}  # fmt: skip


def test_mrope_image_without_metadata_on_lm_only_decode_is_refused_before_any_engine() -> None:
    with pytest.raises(PolicyError) as caught:
        plan(chat(), LM_ONLY, mrope=True)
    assert caught.value.code == "pd_decode_language_model_only_mrope"
    assert (caught.value.status, caught.value.param) == (400, None)


def test_mrope_image_on_a_metadata_decode_renders_on_the_prefill_first() -> None:
    legs = plan(chat(), TAKES_METADATA, mrope=True)
    assert legs.form.name == "MROPE_METADATA"
    assert legs.render == chat()  # the client's chat request, for the prefill to render
    with pytest.raises(ValueError, match="renders first"):
        prefill_body_for(legs)


def test_metadata_legs_prefill_the_pixels_and_decode_the_grid_alone() -> None:
    legs = rendered_plan(plan(chat(stream=True), TAKES_METADATA, mrope=True), render())
    prefill = prefill_body_for(legs)
    assert prefill is not None
    assert prefill["features"]["kwargs_data"] == {"image": ["PIXELS-AND-GRID"]}
    assert prefill["sampling_params"]["max_tokens"] == 1 and prefill["stream"] is False
    assert prefill["kv_transfer_params"] == json.loads(NIXL_PREFILL_PARAMS)
    leg = decode_leg_for(legs, generated())
    assert leg.route == GENERATE and leg.derender is not None
    features = leg.body["features"]
    # The decode gets the grid (placing the image's rotary positions) but no pixels.
    assert features["kwargs_data"] == {"image": ["GRID-ONLY"]}
    assert features["mm_hashes"] == {"image": ["ab" * 32]}
    assert "PIXELS" not in json.dumps(leg.body)
    assert leg.body["kv_transfer_params"]["transfer_id"] == "t1"
    # The engine keys the prefix cache by the hashes it is given: the salt stays the client's.
    assert leg.body["cache_salt"] is None
    assert leg.body["output_mode"] == "tokens"
    json.dumps(leg.body)  # plain JSON types: pydantic and pickling take it


def test_the_metadata_leg_names_each_image_by_its_rendered_hash_and_keeps_a_salt() -> None:
    def features(digest: str, salt: str | None = None) -> Any:
        answer = {**render(mm_hashes={"image": [digest]}), "cache_salt": salt}
        extra = {"cache_salt": salt} if salt else {}
        legs = rendered_plan(plan(chat(**extra), TAKES_METADATA, mrope=True), answer)
        body = decode_leg_for(legs, generated()).body
        return body["features"]["mm_hashes"]["image"], body["cache_salt"]

    assert features("cd" * 32) == (["cd" * 32], None)
    assert features("ab" * 32, "tenant") == (["ab" * 32], "tenant")


@pytest.mark.parametrize(
    ("answer", "prefilled"),
    [
        (render(grids=False), generated()),  # no grid: the decode could not place it
        (render(mm_hashes={"image": [""]}), generated()),  # no content hash
        (render(), generated(kv=None)),  # no KV: the leg would crash the engine
        (render(), generated(ids=IDS[:-1])),  # not the ids rendered
    ],
)
def test_metadata_path_faults_after_prefill_are_502s(answer: Any, prefilled: Any) -> None:
    def legs() -> Any:
        return decode_leg_for(rendered_plan(plan(chat(), TAKES_METADATA, mrope=True), answer),
                              prefilled)  # fmt: skip

    with pytest.raises(PolicyError) as caught:
        legs()
    assert caught.value.status == 502


def test_text_request_on_lm_only_decode_runs_pd_without_a_salt() -> None:
    body = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    leg = decode_body_for(plan(body), reply())
    assert "cache_salt" not in leg
    assert leg["messages"] == body["messages"]


def test_prefill_kv_reads_the_connector() -> None:
    assert prefill_kv({"kv_connector": "TransferConnector"}).mode is KvConnectorMode.TRANSFER
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
    assert len(rows) == 5, rows
    for status, code in rows:
        entry = ERROR_CATALOG[code]
        # A worker's failure has no fixed status in the catalog: the path that raises it
        # names one (the metadata path's render and prefill checks, 502).
        assert entry.status == int(status) or (entry.status is None and status == "502"), code

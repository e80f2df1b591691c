"""Decode prompts: a core decode leg as vLLM's ``TokensPrompt`` and ``SamplingParams``."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from vllm import SamplingParams

from pd_policy import (
    LegacyKvParams,
    MalformedRequest,
    MediaRefsOnLanguageModelOnlyDecode,
    MropeOnLanguageModelOnlyDecode,
    MultimodalBatch,
    MultimodalNotSupported,
    NSamplesOnLanguageModelOnlyDecode,
    PolicyError,
    Request,
    clone_without_mm,
    decode_cache_salt,
    identity_only,
    relay_kv,
)
from pd_policy.tools.scenarios import image_request, media_ref_request, mrope_request, text_request
from pd_policy_vllm import KV_TRANSFER_PARAMS_KEY, decode_inputs

HANDOFF: dict[str, Any] = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_engine_id": "prefill-0",
    "remote_block_ids": [0, 1],
}


def _stripped(request: Request) -> Request:
    return relay_kv(clone_without_mm(request), HANDOFF)


def test_a_stripped_leg_becomes_a_salted_token_prompt() -> None:
    request = image_request(cache_salt="tenant-a")
    leg = _stripped(request)
    built = decode_inputs(leg, SamplingParams(max_tokens=3), language_model_only=True)
    salt = decode_cache_salt(leg)
    assert salt is not None and salt.startswith("mm1:")
    assert salt != decode_cache_salt(_stripped(image_request(images=("cat.jpg",))))
    assert built.prompt == {"prompt_token_ids": list(request.input_ids or ()), "cache_salt": salt}
    assert built.sampling_params.extra_args == {KV_TRANSFER_PARAMS_KEY: HANDOFF}
    assert built.sampling_params.max_tokens == 3


@pytest.mark.parametrize("skip_clone", [False, True])
def test_the_callers_sampling_params_never_change(skip_clone: bool) -> None:
    mine = SamplingParams(
        max_tokens=2,
        skip_clone=skip_clone,
        extra_args={"trace": "t-1", KV_TRANSFER_PARAMS_KEY: {"stale": True}},
    )
    before = json.dumps(mine.extra_args, sort_keys=True)
    built = decode_inputs(_stripped(image_request()), mine, language_model_only=True)
    assert built.sampling_params is not mine
    assert json.dumps(mine.extra_args, sort_keys=True) == before
    assert built.sampling_params.extra_args == {"trace": "t-1", KV_TRANSFER_PARAMS_KEY: HANDOFF}


def test_the_leg_decides_the_handoff() -> None:
    stale = SamplingParams(extra_args={"trace": "t-1", KV_TRANSFER_PARAMS_KEY: {"stale": True}})
    built = decode_inputs(text_request(), stale, language_model_only=True)
    assert built.sampling_params.extra_args == {"trace": "t-1"}
    only_stale = SamplingParams(extra_args={KV_TRANSFER_PARAMS_KEY: {"stale": True}})
    built = decode_inputs(text_request(), only_stale, language_model_only=True)
    assert built.sampling_params.extra_args is None


def test_the_legacy_handoff_is_passed_by_its_wire_names() -> None:
    leg = relay_kv(clone_without_mm(image_request()), kv_legacy=LegacyKvParams("10.0.0.7", 5600))
    built = decode_inputs(leg, SamplingParams(), language_model_only=True)
    assert built.sampling_params.extra_args == {
        KV_TRANSFER_PARAMS_KEY: {"remote_host": "10.0.0.7", "remote_port": 5600}
    }


def test_a_leg_without_salt_or_media_has_no_cache_salt() -> None:
    built = decode_inputs(text_request(), SamplingParams(), language_model_only=True)
    assert "cache_salt" not in built.prompt
    salted = decode_inputs(
        text_request().derive(cache_salt="tenant-a"), SamplingParams(), language_model_only=True
    )
    assert salted.prompt["cache_salt"] == "tenant-a"


def test_a_text_leg_becomes_a_text_prompt() -> None:
    leg = Request("r", text="hello world", cache_salt="tenant-a")
    built = decode_inputs(leg, SamplingParams(), language_model_only=True)
    assert built.prompt == {"prompt": "hello world", "cache_salt": "tenant-a"}


def test_a_multimodal_text_leg_is_refused() -> None:
    leg = Request("r", text="<image> what is this?", batches=(MultimodalBatch(mm_hashes=("h",)),))
    with pytest.raises(MalformedRequest) as caught:
        decode_inputs(leg, SamplingParams(), language_model_only=True)
    assert caught.value.param == "input_ids"


@pytest.mark.parametrize(
    ("leg", "n", "error", "param"),
    [
        (image_request(), 1, MultimodalNotSupported, "batches[0]"),
        (identity_only(image_request()), 1, MultimodalNotSupported, "batches[0]"),
        (mrope_request(), 1, MropeOnLanguageModelOnlyDecode, None),
        (media_ref_request(), 1, MediaRefsOnLanguageModelOnlyDecode, None),
        (clone_without_mm(image_request(n=2)), 2, NSamplesOnLanguageModelOnlyDecode, None),
    ],
    ids=["pixels", "placeholders", "mrope-grids", "media-refs", "n2"],
)
def test_the_language_model_only_guard_runs_first(
    leg: Request, n: int, error: type[PolicyError], param: str | None
) -> None:
    with pytest.raises(error) as caught:
        decode_inputs(leg, SamplingParams(n=n), language_model_only=True)
    assert caught.value.status == 400
    assert caught.value.param == param


def test_media_on_an_mrope_model_is_refused_even_stripped() -> None:
    # clone_without_mm drops the grids, so only the engine knows its positions are M-RoPE.
    leg = _stripped(mrope_request())
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        decode_inputs(leg, SamplingParams(), language_model_only=True, uses_mrope=True)
    grid_less = decode_inputs(leg, SamplingParams(), language_model_only=True)
    assert grid_less.prompt["prompt_token_ids"] == list(leg.input_ids or ())
    text = decode_inputs(
        text_request(), SamplingParams(), language_model_only=True, uses_mrope=True
    )
    assert "cache_salt" not in text.prompt


@pytest.mark.parametrize(
    ("leg", "param"),
    [
        (image_request(), "batches[0]"),
        (identity_only(mrope_request()), "batches[0]"),
        (media_ref_request(), "media_refs"),
    ],
    ids=["pixels", "mrope-grids", "media-refs"],
)
def test_a_token_prompt_cannot_carry_payload_on_any_engine(leg: Request, param: str) -> None:
    with pytest.raises(MultimodalNotSupported) as caught:
        decode_inputs(leg, SamplingParams(), language_model_only=False)
    assert caught.value.param == param


def test_an_identity_leg_without_payload_serves_a_vision_engine() -> None:
    leg = relay_kv(identity_only(image_request(cache_salt="tenant-a")), HANDOFF)
    assert leg.batches[0].placeholders
    built = decode_inputs(leg, SamplingParams(), language_model_only=False)
    assert built.prompt["cache_salt"] == decode_cache_salt(leg)
    assert built.sampling_params.extra_args == {KV_TRANSFER_PARAMS_KEY: HANDOFF}


def test_n_must_be_the_planned_n() -> None:
    with pytest.raises(MalformedRequest) as caught:
        decode_inputs(_stripped(image_request()), SamplingParams(n=2), language_model_only=True)
    assert caught.value.param == "n"
    # A text leg may sample n>1 on a language-model-only engine.
    built = decode_inputs(text_request(n=2), SamplingParams(n=2), language_model_only=True)
    assert built.sampling_params.n == 2


def test_decode_inputs_are_frozen() -> None:
    built = decode_inputs(text_request(), SamplingParams(), language_model_only=True)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        built.prompt = {}  # type: ignore[misc]

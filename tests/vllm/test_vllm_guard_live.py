"""The guard on live engines: a language-model-only engine refuses media with the core's
typed error before vLLM sees it, keeps serving afterwards, and without the guard
vLLM itself fails with an error of its own (not a policy error)."""

from __future__ import annotations

from typing import Any

import pytest
from expanded_prompts import image_request, text_request
from PIL import Image
from tiny_models import TinyModel
from vllm import SamplingParams

from pd_policy import (
    MropeOnLanguageModelOnlyDecode,
    MultimodalNotSupported,
    PolicyError,
    Request,
    clone_without_mm,
)
from pd_policy.tools.scenarios import mrope_request
from pd_policy_vllm import DecodeEngine

GREEDY = SamplingParams(max_tokens=2, temperature=0.0)


def _generates(engine: DecodeEngine, leg: Request) -> bool:
    output = engine.generate(leg, GREEDY)
    return len(output.outputs[0].token_ids) > 0


def test_llava_refuses_pixels_through_the_guard(
    llava_lm_only_engine: Any, llava: TinyModel
) -> None:
    engine = DecodeEngine(llava_lm_only_engine)
    request = image_request(llava, image="a.png", variant=10)
    with pytest.raises(MultimodalNotSupported) as caught:
        engine.generate(request, GREEDY)
    assert caught.value.status == 400
    assert caught.value.param == "batches[0]"
    assert not caught.value.retryable
    assert _generates(engine, clone_without_mm(request))


def test_qwen2vl_refuses_an_mrope_leg_through_the_guard(
    qwen2vl_lm_only_engine: Any,
) -> None:
    engine = DecodeEngine(qwen2vl_lm_only_engine)
    assert engine.guarded and engine.uses_mrope
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        engine.generate(mrope_request(), GREEDY)
    # Stripped of its grids the leg is no better: the image's positions would be lost.
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        engine.generate(clone_without_mm(mrope_request()), GREEDY)
    assert _generates(engine, text_request())


@pytest.mark.parametrize(
    ("engine", "prompt"),
    [
        ("llava_lm_only_engine", "USER: <image>\ndescribe\nASSISTANT:"),
        ("qwen2vl_lm_only_engine", "<|vision_start|><|image_pad|><|vision_end|>describe"),
    ],
)
def test_without_the_guard_vllm_fails_on_its_own(
    engine: str, prompt: str, request: pytest.FixtureRequest
) -> None:
    llm = request.getfixturevalue(engine)
    image = Image.new("RGB", (84, 84), (200, 30, 30))
    with pytest.raises(ValueError, match="Multi-modal processor not available") as caught:
        llm.generate(
            [{"prompt": prompt, "multi_modal_data": {"image": image}}], GREEDY, use_tqdm=False
        )
    assert not isinstance(caught.value, PolicyError)
    assert _generates(DecodeEngine(llm), text_request())


def test_a_text_model_serves_text_legs(llama_engine: Any) -> None:
    engine = DecodeEngine(llama_engine)
    assert engine.guarded and not engine.uses_mrope
    assert _generates(engine, Request("t", text="hello world", cache_salt="tenant-a"))
    assert _generates(engine, text_request())


def test_a_vision_engine_is_not_guarded(qwen2vl_engine: Any) -> None:
    engine = DecodeEngine(qwen2vl_engine)
    assert engine.supports_vision and not engine.guarded
    assert _generates(engine, text_request())

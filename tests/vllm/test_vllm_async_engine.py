"""The adapter on a live ``AsyncLLM``, the engine a gRPC servicer holds.

``AsyncLLM`` runs its engine core in a child process even in-process mode, so this
module starts one, uses it and shuts it down before the next module runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from expanded_prompts import image_request
from live_engines import BLOCK_SIZE, ENGINE_SETTINGS
from tiny_models import TinyModel
from vllm import SamplingParams

from pd_policy import EngineFacts, MmInputProbe, Request, clone_without_mm
from pd_policy_vllm import decode_inputs, engine_facts, supports_vision


async def _cached_tokens(engine: Any, leg: Request, request_id: str) -> int:
    built = decode_inputs(
        leg, SamplingParams(max_tokens=1, temperature=0.0), language_model_only=True
    )
    cached = -1
    async for output in engine.generate(built.prompt, built.sampling_params, request_id=request_id):
        cached = output.num_cached_tokens
    return cached


async def _serve(model: TinyModel) -> tuple[EngineFacts, bool, list[int]]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    args = AsyncEngineArgs(
        model=str(model.path), language_model_only=True, block_size=BLOCK_SIZE, **ENGINE_SETTINGS
    )
    engine = AsyncLLM.from_engine_args(args)
    try:
        a = clone_without_mm(image_request(model, image="a.png", variant=20))
        b = clone_without_mm(image_request(model, image="b.png", variant=20))
        cached = [
            await _cached_tokens(engine, leg, f"async-{i}") for i, leg in enumerate((a, b, a))
        ]
        return engine_facts(engine), supports_vision(engine), cached
    finally:
        engine.shutdown()


def test_async_llm_facts_and_salted_decode(llava: TinyModel) -> None:
    facts, vision, cached = asyncio.run(_serve(llava))
    assert facts == EngineFacts(
        is_multimodal_model=True,
        mm_input_probe=MmInputProbe.UNSUPPORTED,
        language_model_only=True,
        modality_limits={"image": 0},
    )
    assert vision is False
    assert cached[0] == 0
    assert cached[1] == 0
    assert cached[2] > 0

"""Salt isolation on a live language-model-only engine (tiny LLaVA, block size 32).

The same expanded placeholder run, behind images with different content hashes,
must never share prefix-cache blocks on a decode worker; the same image must. A
core ``TEXT_PLUS_HASHES`` leg (``clone_without_mm``) reaches the engine through
the adapter, and ``RequestOutput.num_cached_tokens`` reports the hit.
"""

from __future__ import annotations

from typing import Any

import pytest
from expanded_prompts import image_request
from tiny_models import TinyModel
from vllm import SamplingParams

from pd_policy import Request, clone_without_mm
from pd_policy_vllm import DecodeEngine


@pytest.fixture(scope="module")
def decode_engine(llava_lm_only_engine: Any) -> DecodeEngine:
    engine = DecodeEngine(llava_lm_only_engine)
    assert engine.guarded
    return engine


def _cached_tokens(engine: DecodeEngine, leg: Request) -> int:
    output = engine.generate(leg, SamplingParams(max_tokens=1, temperature=0.0))
    assert len(output.prompt_token_ids) == len(leg.input_ids or ())
    cached: int = output.num_cached_tokens
    return cached


def _leg(model: TinyModel, image: str, variant: int, cache_salt: str | None = None) -> Request:
    return clone_without_mm(
        image_request(model, image=image, variant=variant, cache_salt=cache_salt)
    )


def test_another_image_gets_no_hit_and_the_same_image_does(
    decode_engine: DecodeEngine, llava: TinyModel
) -> None:
    a, b = _leg(llava, "a.png", variant=1), _leg(llava, "b.png", variant=1)
    assert a.input_ids == b.input_ids  # only the hashes differ
    assert _cached_tokens(decode_engine, a) == 0
    assert _cached_tokens(decode_engine, b) == 0
    assert _cached_tokens(decode_engine, a) > 0


def test_tenants_with_the_same_image_share_nothing(
    decode_engine: DecodeEngine, llava: TinyModel
) -> None:
    first = _leg(llava, "a.png", variant=2, cache_salt="tenant-1")
    second = _leg(llava, "a.png", variant=2, cache_salt="tenant-2")
    assert _cached_tokens(decode_engine, first) == 0
    assert _cached_tokens(decode_engine, second) == 0
    # The cache is live: each tenant hits its own blocks.
    assert _cached_tokens(decode_engine, first) > 0
    assert _cached_tokens(decode_engine, second) > 0


def test_without_the_hashes_two_images_alias(decode_engine: DecodeEngine, llava: TinyModel) -> None:
    """The failure the fold prevents: a leg stripped of everything, hashes included,
    is a bare token prompt, and image B is served image A's blocks."""
    a, b = _leg(llava, "a.png", variant=3), _leg(llava, "b.png", variant=3)
    bare_a, bare_b = a.derive(batches=()), b.derive(batches=())
    assert _cached_tokens(decode_engine, bare_a) == 0
    assert _cached_tokens(decode_engine, bare_b) > 0

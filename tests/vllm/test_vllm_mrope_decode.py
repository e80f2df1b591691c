"""Live: Qwen2-VL (M-RoPE) served by a ``language_model_only`` decode engine that takes KV.

A full-vision prefill engine (KV producer) and a language-model-only decode
engine (KV consumer), both on the ``TransferConnector``, serve images A, B, A
exactly as one full-vision engine does: the decode leg carries each image's
grid, content hash and placeholder range and no pixels, and the decode engine
never encodes anything. Every engine runs fp32 at temperature 0, in this
process, on the tiny Qwen2-VL built in a fixture.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from live_engines import BLOCK_SIZE
from qwen_prompts import A, B, prompt
from vllm import SamplingParams

from pd_policy import (
    DecodeForm,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
)
from pd_policy_vllm import (
    DecodeEngine,
    accepts_mm_metadata,
    decode_inputs,
    generate_one,
    supports_vision,
)
from pd_policy_vllm.local_pd import LocalPd, PdResult

SCORED = SamplingParams(max_tokens=8, temperature=0.0, logprobs=0)


@pytest.fixture
def baseline(qwen_baseline: Any) -> Any:
    return qwen_baseline


@pytest.fixture
def prefill(qwen_prefill: Any) -> Any:
    return qwen_prefill


@pytest.fixture
def decode(qwen_decode: Any) -> Any:
    return qwen_decode


def expected(engine: Any, text: str, picture: Any) -> Any:
    request = {"prompt": text, "multi_modal_data": {"image": [picture]}}
    return engine.generate([request], SCORED, use_tqdm=False)[0].outputs[0]


def sampled_logprobs(completion: Any) -> list[float]:
    return [
        float(step[t].logprob)
        for t, step in zip(completion.token_ids, completion.logprobs, strict=True)
    ]


def local_hits(result: PdResult) -> int:
    assert result.decode_kv_report is not None
    hits: int = result.decode_kv_report["local_cached_tokens"]
    return hits


def test_a_language_model_only_kv_consumer_says_it_takes_metadata(
    prefill: Any, decode: Any, qwen2vl_lm_only_engine: Any
) -> None:
    assert not supports_vision(decode)
    assert accepts_mm_metadata(decode)
    assert not accepts_mm_metadata(prefill)  # a producer
    assert not accepts_mm_metadata(qwen2vl_lm_only_engine)  # not a KV consumer
    assert LocalPd(prefill, decode).decode_worker.takes_mm_metadata


def test_images_a_b_a_match_one_full_vision_engine(
    baseline: Any, prefill: Any, decode: Any
) -> None:
    text = prompt("abA")
    expected_a, expected_b = expected(baseline, text, A), expected(baseline, text, B)
    assert list(expected_a.token_ids) != list(expected_b.token_ids)  # else it proves nothing
    pd = LocalPd(prefill, decode)
    first_a, b, again_a = (pd.generate(text, [picture], SCORED) for picture in (A, B, A))
    for result, want in ((first_a, expected_a), (b, expected_b), (again_a, expected_a)):
        assert result.form is DecodeForm.MROPE_METADATA
        assert list(result.token_ids) == list(want.token_ids)
        assert result.logprobs == pytest.approx(sampled_logprobs(want), abs=1e-5)
    # The leg carried the grid, the hash and the placeholder, and no pixels.
    batch = first_a.leg.batches[0]
    assert batch.pixel_values is None and batch.tensor_names == ("image_grid_thw",)
    assert batch.keep_on_cpu_keys == ("image_grid_thw",) and len(batch.placeholders) == 1
    # The decode engine's own prefix cache keys blocks by the hash: A again hits, B does not.
    assert (local_hits(first_a), local_hits(b)) == (0, 0)
    assert local_hits(again_a) > 0
    assert first_a.decode_kv_report is not None and first_a.decode_kv_report["loaded_tokens"]


def test_an_image_in_the_partial_last_block_matches(
    baseline: Any, prefill: Any, decode: Any
) -> None:
    text = prompt("late", late=True)  # "late": the variant the word count was measured with
    result = LocalPd(prefill, decode).generate(text, [B], SCORED)
    (placeholder,) = result.leg.batches[0].placeholders
    ids = len(result.leg.input_ids or ())
    assert placeholder.offset >= ids // BLOCK_SIZE * BLOCK_SIZE  # in the partial last block
    want = expected(baseline, text, B)
    assert list(result.token_ids) == list(want.token_ids)
    assert result.logprobs == pytest.approx(sampled_logprobs(want), abs=1e-5)


def test_the_wrong_grid_gives_other_logprobs(prefill: Any, decode: Any) -> None:
    # The control: the test sees the grid. Same ids, same hash, same KV; grid (1, 4, 16) has
    # as many placeholder ids as (1, 8, 8) and is accepted, but rotates the image otherwise.
    text = prompt("grid")
    pd = LocalPd(prefill, decode)
    right = pd.generate(text, [A], SCORED)
    engine = DecodeEngine(decode)
    wrong = generate_one(
        decode,
        engine.inputs(right.leg, SCORED, grids=[{"image_grid_thw": torch.tensor([[1, 4, 16]])}]),
        "wrong-grid",
    )
    assert right.logprobs is not None
    assert sampled_logprobs(wrong.outputs[0]) != pytest.approx(right.logprobs, abs=1e-5)


def test_a_language_model_only_engine_that_is_no_consumer_gets_the_mrope_400(
    prefill: Any, qwen2vl_lm_only_engine: Any
) -> None:
    calls: list[str] = []

    class Recording:
        def __init__(self, llm: Any, name: str) -> None:
            self._llm, self._name = llm, name

        def generate(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(self._name)
            return self._llm.generate(*args, **kwargs)

        def __getattr__(self, name: str) -> Any:
            return getattr(self._llm, name)

    pd = LocalPd(Recording(prefill, "prefill"), Recording(qwen2vl_lm_only_engine, "decode"))
    assert not pd.decode_worker.takes_mm_metadata
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        pd.generate(prompt("refused"), [A], SCORED)
    assert calls == []


def test_a_metadata_leg_without_kv_never_reaches_the_engine(
    baseline: Any, prefill: Any, decode: Any
) -> None:
    # Given such a request, the engine would try to encode the image and die
    # (AssertionError on the missing embeddings; in-process, the next request hangs).
    text = prompt("guard")
    pd = LocalPd(prefill, decode)
    served = pd.generate(text, [A], SCORED)
    bare = served.leg.derive(kv_transfer_params=None)
    engine = DecodeEngine(decode)
    grids = [pd.preprocess(text, [A]).grid_values]
    with pytest.raises(MissingKvTransferParams):
        engine.inputs(bare, SCORED, grids=grids)
    with pytest.raises(MissingKvTransferParams):
        decode_inputs(
            bare, SCORED, language_model_only=True, uses_mrope=True, takes_mm_metadata=True,
            grids=grids,
        )  # fmt: skip
    # The engine still serves.
    again = pd.generate(prompt("after the guard"), [B], SCORED)
    want = expected(baseline, prompt("after the guard"), B)
    assert list(again.token_ids) == list(want.token_ids)

"""Live P/D on CPU: a vision prefill engine and a language-model-only decode engine of the
same tiny model, joined by a real KV handoff (``TransferConnector``), answer an image
request exactly as one full engine does, and stay exact when two different images of
the same size stand behind the same prompt.

Every engine here runs fp32 at temperature 0, in this process, on tiny local models.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from live_engines import BLOCK_SIZE, start_engine
from PIL import Image
from tiny_models import TinyModel
from vllm import SamplingParams
from vllm.inputs import TokensPrompt

from pd_policy import (
    DecodeForm,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    PolicyError,
)
from pd_policy_vllm.local_pd import LocalPd, PdResult
from pd_policy_vllm.transfer_connector import kv_transfer_config

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)
_FILLER = "describe the red dog on the mat and the blue cat"


def image(seed: int) -> Image.Image:
    """An 84x84 image (36 placeholder ids on the tiny LLaVA); seeds give different pixels."""
    pixels = np.random.default_rng(seed).integers(0, 255, (84, 84, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


A, B = image(1), image(2)


def image_prompt(variant: str, *, late: bool = False) -> str:
    """A prompt over three blocks; ``variant`` keeps tests out of each other's prefix cache.

    ``late`` puts the image at the end, in the prompt's partial last block: with one
    filler less, the expanded prompt is 117 ids, so its last 21 (most of the image)
    lie past the last whole 32-id block.
    """
    if late:
        text = " ".join([variant, *[_FILLER] * 5])
        return f"USER: {text}\n<image>\nASSISTANT:"
    text = " ".join([variant, *[_FILLER] * 6])
    return f"USER: <image>\n{text}\nASSISTANT:"


def text_prompt(variant: str) -> str:
    return f"USER: {' '.join([variant, *[_FILLER] * 7])}\nASSISTANT:"


class Recording:
    """An engine seen through a proxy that records every ``generate`` call."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.calls = 0

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._llm.generate(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)


# --- engines -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def transfers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("transfers")


def _llava(llava: TinyModel, transfers: Path, role: str, **overrides: Any) -> Iterator[Any]:
    options = {k: overrides.pop(k) for k in ("partial_blocks", "return_params") if k in overrides}
    llm = start_engine(
        llava,
        block_size=BLOCK_SIZE,
        kv_transfer_config=kv_transfer_config(role, transfers, **options),
        **overrides,
    )
    yield llm
    llm.llm_engine.engine_core.shutdown()


@pytest.fixture(scope="session")
def baseline(llava: TinyModel, transfers: Path) -> Iterator[Any]:
    """One full-vision engine, no P/D: the answer to match."""
    yield from _llava(llava, transfers, "kv_producer", limit_mm_per_prompt={"image": 1})


@pytest.fixture(scope="session")
def prefill(llava: TinyModel, transfers: Path) -> Iterator[Any]:
    """The vision prefill engine."""
    yield from _llava(llava, transfers, "kv_producer", limit_mm_per_prompt={"image": 1})


@pytest.fixture(scope="session")
def silent_prefill(llava: TinyModel, transfers: Path) -> Iterator[Any]:
    """A prefill whose connector returns no parameters (an outdated servicer, say)."""
    yield from _llava(
        llava, transfers, "kv_producer", limit_mm_per_prompt={"image": 1}, return_params=False
    )


@pytest.fixture(scope="session")
def decode(llava: TinyModel, transfers: Path) -> Iterator[Any]:
    """The ``--language-model-only`` decode engine: no vision tower, encoder budget 0."""
    yield from _llava(llava, transfers, "kv_consumer", language_model_only=True)


@pytest.fixture(scope="session")
def whole_block_decode(llava: TinyModel, transfers: Path) -> Iterator[Any]:
    """A decode engine whose connector loads whole blocks only (the first design's bug)."""
    yield from _llava(
        llava, transfers, "kv_consumer", language_model_only=True, partial_blocks=False
    )


def baseline_tokens(engine: Any, prompt: str, *images: Image.Image) -> list[int]:
    request: dict[str, Any] = {"prompt": prompt}
    if images:
        request["multi_modal_data"] = {"image": list(images)}
    output = engine.generate([request], GREEDY, use_tqdm=False)[0]
    return list(output.outputs[0].token_ids)


def local_hits(result: PdResult) -> int:
    assert result.decode_kv_report is not None
    hits: int = result.decode_kv_report["local_cached_tokens"]
    return hits


# --- the live tests ----------------------------------------------------------------


def test_images_a_b_a_match_one_full_engine(baseline: Any, prefill: Any, decode: Any) -> None:
    pd = LocalPd(prefill, decode)
    assert pd.decode_worker.language_model_only  # read from the live engine's honest probe
    prompt = image_prompt("abA")
    expected_a, expected_b = (
        baseline_tokens(baseline, prompt, A),
        baseline_tokens(baseline, prompt, B),
    )
    assert expected_a != expected_b  # otherwise matching them would prove nothing

    first_a, b, again_a = (pd.generate(prompt, [img], GREEDY) for img in (A, B, A))

    assert [list(r.token_ids) for r in (first_a, b, again_a)] == [
        expected_a,
        expected_b,
        expected_a,
    ]
    assert {r.form for r in (first_a, b, again_a)} == {DecodeForm.TEXT_PLUS_HASHES}
    # The decode leg carried ids, hashes and the relayed parameters only.
    assert first_a.leg.batches[0].is_hash_identity
    assert first_a.leg.kv_transfer_params_dict() == {
        k: v
        for k, v in (first_a.prefill_kv_params or {}).items()
        if k != "remote_prefill_cached_tokens"
    }
    # The decode engine's own prefix cache: a hit for A again, none for B.
    assert (local_hits(first_a), local_hits(b)) == (0, 0)
    assert local_hits(again_a) > 0
    # What was not cached locally came from the prefill, image tokens included.
    assert first_a.decode_kv_report is not None and b.decode_kv_report is not None
    assert first_a.decode_kv_report["loaded_tokens"] > 0
    assert b.decode_kv_report["loaded_tokens"] > 0
    assert first_a.cache_salt != b.cache_salt
    assert first_a.cache_salt == again_a.cache_salt


def test_the_hazard_without_the_salt_fold(baseline: Any, prefill: Any, decode: Any) -> None:
    prompt = image_prompt("hazard")
    expected_b = baseline_tokens(baseline, prompt, B)
    pd = LocalPd(prefill, decode, fold_salt=False)
    first_a = pd.generate(prompt, [A], GREEDY)
    b = pd.generate(prompt, [B], GREEDY)
    # B's decode leg hashes like A's: the decode prefix cache serves A's blocks to B...
    assert local_hits(first_a) == 0
    assert local_hits(b) > 0
    # ...and B gets an answer that is not B's (A's KV for the image, B's for the tail it
    # loaded). The fold exists to prevent exactly this.
    assert list(b.token_ids) != expected_b


def test_the_partial_last_block_must_move(
    baseline: Any, prefill: Any, decode: Any, whole_block_decode: Any
) -> None:
    # Tokens alone can hide the damage on a tiny model (its argmax is often the same
    # token); the log-probabilities of the same greedy tokens cannot.
    scored = SamplingParams(max_tokens=4, temperature=0.0, logprobs=0)
    prompt = image_prompt("late", late=True)
    expected = baseline.generate(
        [{"prompt": prompt, "multi_modal_data": {"image": [B]}}], scored, use_tqdm=False
    )[0].outputs[0]
    whole = LocalPd(prefill, whole_block_decode).generate(prompt, [B], scored)
    partial = LocalPd(prefill, decode).generate(prompt, [B], scored)
    assert whole.decode_kv_report is not None and partial.decode_kv_report is not None
    # The image ends in the prompt's partial last block, which whole blocks leave behind.
    assert whole.decode_kv_report["loaded_tokens"] % BLOCK_SIZE == 0
    assert partial.decode_kv_report["loaded_tokens"] > whole.decode_kv_report["loaded_tokens"]
    assert list(partial.token_ids) == list(expected.token_ids)
    assert partial.cumulative_logprob == pytest.approx(expected.cumulative_logprob, abs=1e-4)
    # Whole blocks only: the image ids in the tail are recomputed as text.
    assert whole.cumulative_logprob != pytest.approx(expected.cumulative_logprob, abs=1e-2)


def test_qwen2vl_is_refused_before_any_request(
    qwen2vl_engine: Any, qwen2vl_lm_only_engine: Any
) -> None:
    prefill, decode = Recording(qwen2vl_engine), Recording(qwen2vl_lm_only_engine)
    pd = LocalPd(prefill, decode)
    picture = Image.fromarray(np.zeros((56, 56, 3), dtype=np.uint8))
    prompt = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n"
    with pytest.raises(MropeOnLanguageModelOnlyDecode) as caught:
        pd.generate(prompt, [picture], GREEDY)
    assert caught.value.status == 400
    assert (prefill.calls, decode.calls) == (0, 0)
    # Nothing crashed in either engine: both still serve.
    for engine in (qwen2vl_engine, qwen2vl_lm_only_engine):
        assert baseline_tokens(engine, "hello world")


def test_n2_with_an_image_is_refused(prefill: Any, decode: Any) -> None:
    recording = Recording(prefill), Recording(decode)
    pd = LocalPd(*recording)
    with pytest.raises(NSamplesOnLanguageModelOnlyDecode) as caught:
        pd.generate(image_prompt("n2"), [A], SamplingParams(n=2, max_tokens=4, temperature=0.5))
    assert caught.value.status == 400
    assert [r.calls for r in recording] == [0, 0]


def test_no_kv_parameters_is_a_502_for_an_image_but_text_recomputes(
    baseline: Any, silent_prefill: Any, decode: Any
) -> None:
    recording = Recording(decode)
    pd = LocalPd(silent_prefill, recording)
    with pytest.raises(MissingKvTransferParams) as caught:
        pd.generate(image_prompt("silent"), [A], GREEDY)
    assert caught.value.status == 502
    assert not caught.value.retryable
    assert recording.calls == 0  # refused after prefill, before any decode request
    prompt = text_prompt("silent text")
    result = pd.generate(prompt, [], GREEDY)
    assert result.prefill_kv_params is None
    assert list(result.token_ids) == baseline_tokens(baseline, prompt)


def test_a_text_request_matches_its_baseline(baseline: Any, prefill: Any, decode: Any) -> None:
    prompt = text_prompt("plain text")
    result = LocalPd(prefill, decode).generate(prompt, [], GREEDY)
    assert result.form is DecodeForm.TEXT_PLUS_HASHES
    assert result.decode_kv_report is not None
    assert result.decode_kv_report["loaded_tokens"] > 0  # the handoff carried text too
    assert list(result.token_ids) == baseline_tokens(baseline, prompt)


def test_the_decode_side_loads_only_the_named_transfer(prefill: Any, decode: Any) -> None:
    prompt = image_prompt("named")
    pd = LocalPd(prefill, decode)
    result = pd.generate(prompt, [A], GREEDY)
    params = result.leg.kv_transfer_params_dict()
    assert params is not None
    # The same transfer for a different prompt is refused by the connector, not loaded.
    other = [t + 1 for t in result.leg.input_ids or ()]
    output = decode.generate(
        [TokensPrompt(prompt_token_ids=other)],
        SamplingParams(max_tokens=2, temperature=0.0, extra_args={"kv_transfer_params": params}),
        use_tqdm=False,
    )[0]
    assert output.kv_transfer_params["loaded_tokens"] == 0
    assert "not the prefill's expanded prompt" in output.kv_transfer_params["error"]
    # And the driver never lets a stripped image leg through when nothing was loaded.
    missing = dict(params, transfer_id="no-such-transfer")
    output = decode.generate(
        [TokensPrompt(prompt_token_ids=list(result.leg.input_ids or ()))],
        SamplingParams(max_tokens=2, temperature=0.0, extra_args={"kv_transfer_params": missing}),
        use_tqdm=False,
    )[0]
    assert output.kv_transfer_params == {"loaded_tokens": 0, "error": "no such transfer"}


def test_policy_errors_leave_the_engines_serving(prefill: Any, decode: Any) -> None:
    pd = LocalPd(prefill, decode)
    with pytest.raises(PolicyError):
        pd.generate(image_prompt("after"), [A], SamplingParams(n=3, max_tokens=2))
    assert pd.generate(image_prompt("after"), [A], GREEDY).token_ids

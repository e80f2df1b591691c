"""The M-RoPE metadata path on Ray Serve LLM: Qwen2-VL on a language-model-only decode.

The shared deployment (``ray_pd``, ``ray_stand.py``) runs, at ``/mrope``, the policy's
application of the tiny Qwen2-VL (an M-RoPE model) on the ``TransferConnector``: a
full-vision prefill replica (``PolicyPrefillServer``, which renders) and one
``language_model_only`` decode replica (a KV consumer, which takes each image's grid).
The baseline is a full-vision engine of the same model in this process. The module is
named to run right after the LLaVA one, so that the deployment starts once.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from http_peers import data_url, http_json
from qwen_prompts import _WORDS, A, B
from ray_fleet import RayFleet

MAX_TOKENS = 6
IMAGES = {"A": A, "B": B}


def text(variant: str) -> str:
    # The measured prompt of qwen_prompts as chat text: images A and B answer differently.
    return " ".join([variant, *(_WORDS[(i * 7) % len(_WORDS)] for i in range(66))])


def messages(picture: str | None, variant: str) -> list[Any]:
    content: list[Any] = [{"type": "text", "text": text(variant)}]
    if picture is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": data_url(IMAGES[picture])}})
    return [{"role": "user", "content": content}]


def body(picture: str | None, variant: str = "ray", **extra: Any) -> dict[str, Any]:
    return {"model": "qwen2vl", "messages": messages(picture, variant), "max_tokens": MAX_TOKENS,
            "temperature": 0, "logprobs": True, "return_token_ids": True, **extra}  # fmt: skip


@pytest.fixture(scope="module")
def baseline(qwen_baseline: Any) -> Any:
    """What a full-vision engine answers, by image and variant: token ids, logprobs and
    the prompt's length."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=0)
    answers = {}
    for picture in (*IMAGES, None):
        for variant in ("ray", "ray-s"):
            (out,) = qwen_baseline.chat(messages(picture, variant), params, use_tqdm=False)
            done = out.outputs[0]
            logprobs = [lp[t].logprob for lp, t in zip(done.logprobs, done.token_ids, strict=True)]
            answers[picture, variant] = (list(done.token_ids), logprobs, len(out.prompt_token_ids))
    return answers


def ask(fleet: RayFleet, payload: dict[str, Any]) -> tuple[int, Any]:
    return http_json(f"{fleet.url}/mrope/v1/chat/completions", payload, timeout=300)


def stream(fleet: RayFleet, payload: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The token ids of a streamed answer, and the prompt ids its first chunk carries."""
    import urllib.request

    request = urllib.request.Request(
        f"{fleet.url}/mrope/v1/chat/completions", json.dumps({**payload, "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    tokens: list[int] = []
    prompt: list[int] = []
    with urllib.request.urlopen(request, timeout=300) as answer:
        events = answer.read().decode().split("\n\n")
    assert events[-2] == "data: [DONE]", events[-3:]
    for event in events[:-2]:
        chunk = json.loads(event.removeprefix("data: "))
        prompt = prompt or chunk.get("prompt_token_ids") or []
        for choice in chunk["choices"]:
            tokens += choice.get("token_ids") or []
    return tokens, prompt


def close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(
        math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got, want, strict=True)
    )


def test_images_a_b_a_equal_a_full_vision_engine_on_a_language_model_only_replica(
    ray_pd: RayFleet, baseline: Any
) -> None:
    assert baseline["A", "ray"][0] != baseline["B", "ray"][0]  # else equality proves nothing
    for picture in ("A", "B", "A"):
        status, reply = ask(ray_pd, body(picture))
        assert status == 200, reply
        tokens, logprobs, prompt = baseline[picture, "ray"]
        choice = reply["choices"][0]
        assert choice["token_ids"] == tokens, picture
        assert close([t["logprob"] for t in choice["logprobs"]["content"]], logprobs), picture
        assert reply["usage"]["prompt_tokens"] == len(reply["prompt_token_ids"]) == prompt
        kv = reply["kv_transfer_params"]
        # Every prompt token but the last came from the prefill's KV or the replica's cache.
        assert kv["loaded_tokens"] + kv["local_cached_tokens"] == prompt - 1


def test_streamed_answers_equal_the_engine_and_carry_the_prompt_ids(
    ray_pd: RayFleet, baseline: Any
) -> None:
    for picture in ("B", "A"):
        tokens, prompt = stream(ray_pd, body(picture, "ray-s"))
        assert tokens == baseline[picture, "ray-s"][0], picture
        assert len(prompt) == baseline[picture, "ray-s"][2]


def test_text_through_the_m_rope_deployment_equals_the_engine(
    ray_pd: RayFleet, baseline: Any
) -> None:
    status, reply = ask(ray_pd, body(None))
    assert status == 200, reply
    assert reply["choices"][0]["token_ids"] == baseline[None, "ray"][0]


def test_the_replica_reads_itself_as_taking_m_rope_metadata(ray_pd: RayFleet) -> None:
    (line,) = ray_pd.capability_lines("mrope").values()
    assert "supports_vision=FALSE accepts_mm_metadata=TRUE mrope=True" in line


def test_image_requests_ran_the_metadata_path_and_sent_decode_no_pixels(ray_pd: RayFleet) -> None:
    status, reply = ask(ray_pd, body("B", "ray-log"))
    assert status == 200, reply
    lines = [json.loads(line.split(" -- ", 1)[1]) for line in ray_pd.request_lines("mrope")]
    metadata = [line for line in lines if line["form"] == "mrope_metadata"]
    # Every image request so far took it (text decodes as text_plus_hashes; "-" is refused).
    forms = {line["form"] for line in lines}
    assert metadata and forms <= {"mrope_metadata", "text_plus_hashes", "-"}, forms
    # The image alone is a 50 KB data URL (random pixels do not compress), its pixel
    # tensor larger still; the decode leg is the ids, the grid, the hash and the KV
    # parameters.
    image = len(data_url(B))
    assert image > 40_000
    assert all(line["decode_bytes"] < image / 4 for line in metadata), metadata


def test_n_above_one_with_an_image_is_a_typed_400(ray_pd: RayFleet) -> None:
    status, reply = ask(ray_pd, body("A", n=2))
    assert status == 400, reply
    assert "pd_decode_language_model_only_n_samples: " in reply["error"]["message"]

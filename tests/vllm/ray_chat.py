"""Chat requests of the tiny LLaVA to a Ray Serve LLM application, and the answers of one
full-vision engine of the same model to match them: what the LLaVA Ray modules share.

The answers to match come from a vLLM engine in the test's process, no P/D
([`engine_answers`][ray_chat.engine_answers]); a reply matches when its text is the
engine's and its logprobs are equal but for float noise ([`close`][ray_chat.close]).
"""

from __future__ import annotations

import math
from typing import Any, Final

from http_peers import data_url, http_json
from live_engines import BLOCK_SIZE, start_engine
from router_side import image
from tiny_models import TinyModel

__all__ = ["IMAGES", "MAX_TOKENS", "answer", "ask", "body", "close", "engine_answers", "messages"]

MAX_TOKENS: Final = 6
IMAGES: Final = {"A": image(11), "B": image(12)}


def messages(picture: str | None, text: str = "What is in the picture?") -> list[Any]:
    content: list[Any] = [{"type": "text", "text": text}]
    if picture is not None:
        content.append({"type": "image_url", "image_url": {"url": data_url(IMAGES[picture])}})
    return [{"role": "user", "content": content}]


def body(picture: str | None, **extra: Any) -> dict[str, Any]:
    return {"model": "llava", "messages": messages(picture), "max_tokens": MAX_TOKENS,
            "temperature": 0, "logprobs": True, **extra}  # fmt: skip


def engine_answers(llava: TinyModel) -> dict[str | None, tuple[str, list[float], int]]:
    """What one full-vision engine answers, by image (``None``: text): the text, each
    token's logprob, and the prompt's length. The engine is stopped before returning."""
    from vllm import SamplingParams

    llm = start_engine(llava, block_size=BLOCK_SIZE)
    try:
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=0)
        answers = {}
        for picture in (*IMAGES, None):
            (out,) = llm.chat(messages(picture), params, use_tqdm=False)
            completion = out.outputs[0]
            answers[picture] = (
                completion.text,
                [
                    lp[t].logprob
                    for lp, t in zip(completion.logprobs, completion.token_ids, strict=True)
                ],
                len(out.prompt_token_ids),
            )
        return answers
    finally:
        llm.llm_engine.engine_core.shutdown()


def ask(url: str, payload: dict[str, Any], prefix: str = "") -> tuple[int, Any]:
    """POST a chat completion to the application at ``url`` (its route ``prefix``)."""
    return http_json(f"{url}{prefix}/v1/chat/completions", payload, timeout=300)


def close(got: list[float], want: list[float]) -> bool:
    """Logprobs equal but for float noise (the same kernels, the KV copied, not recomputed)."""
    return len(got) == len(want) and all(
        math.isclose(a, b, abs_tol=1e-4) for a, b in zip(got, want, strict=True)
    )


def answer(reply: Any) -> tuple[str, list[float]]:
    choice = reply["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]

"""The M-RoPE metadata path of one request on Ray: render, prefill, decode, derender.

An M-RoPE image (Qwen2-VL) on a language-model-only decode replica needs, besides the
prefill's KV, each image's content hash, placeholder range and grid: the grid places the
image's rotary positions, and the decode has no vision processor to compute it. The
request goes through these steps, each a state of its own, each able to end it:

1. ``render``: the prefill replica renders the chat request (``render_chat``);
2. ``prefill``: it runs the rendered request, pixels included, as a token-in prefill
   tagged for the handoff (``generate``), and answers with the prompt ids and the KV
   parameters;
3. ``decode``: the decode replica runs the rendered request with metadata-only items,
   the relayed KV parameters and the folded ``cache_salt`` on its own engine (token-in
   generate; no pixels reach it);
4. ``derender``: the decode's engine turns the tokens into the client's chat completion,
   whole or chunk by chunk.

Every leg is the core's ([`legs`][pd_policy_ray.legs]): a stripped leg without KV is
the core's 502 before the decode engine is called (measured: a metadata leg without KV
crashes the engine), and a render that gives an image no grid is a 502 too.
"""

from __future__ import annotations

import enum
import json
from collections.abc import AsyncGenerator
from typing import Any

from pd_policy_vllm.openai.plan.legs import Leg

from .scale_out import ScaleOut

__all__ = ["Step", "decode_metadata_leg"]


class Step(enum.Enum):
    """Where a metadata-path request is; a failure is named by the step it ended in."""

    RENDER = "render"
    PREFILL = "prefill"
    DECODE = "decode"
    DERENDER = "derender"


def _failed(reply: Any) -> bool:
    from .seam import ErrorResponse

    return isinstance(reply, ErrorResponse)


def _event(data: Any) -> str:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n"


async def decode_metadata_leg(leg: Leg, local: ScaleOut) -> AsyncGenerator[tuple[Step, Any], None]:
    """Run the decode ``leg`` on the replica's own engine ``local`` and derender it.

    Yields ``(step, item)``: Ray's ``ChatCompletionResponse`` (whole), or the stream's
    SSE strings up to ``data: [DONE]``; a failure is Ray's ``ErrorResponse``, the last
    item, under the step that failed (mid-stream, the client has had the chunks before
    it, as from any engine that fails mid-stream)."""
    from .seam import ChatCompletionResponse

    derender = leg.derender
    if derender is None:
        raise ValueError("a metadata leg has a derender")
    if not leg.body.get("stream"):
        whole = await local.generate(leg.body)
        if _failed(whole):
            yield Step.DECODE, whole
            return
        answer = await local.derender_whole(derender.whole(whole))
        if _failed(answer):
            yield Step.DERENDER, answer
            return
        yield Step.DERENDER, ChatCompletionResponse.model_validate(derender.with_prompt_ids(answer))
        return
    state, first = None, True
    async for chunk in local.generate_stream(leg.body):
        if _failed(chunk):
            yield Step.DECODE, chunk
            return
        derendered = await local.derender_chunk(derender.chunk(chunk, state))
        if _failed(derendered):
            yield Step.DERENDER, derendered
            return
        out, state = derendered
        yield Step.DERENDER, _event(derender.with_prompt_ids(out) if first else out)
        first = False
    yield Step.DERENDER, "data: [DONE]\n\n"

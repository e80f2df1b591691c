"""The Ray decode server's request life, with a stand-in prefill handle and engine.

The live module beside it runs the real deployment; here, the faults a real
prefill deployment is not made to show in one session: a prefill that hands no KV, a
prefill that answers an error. Each test checks which legs ran.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ErrorInfo,
    ErrorResponse,
)
from ray.llm._internal.serve.core.server.llm_server import LLMServer

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_ray.server import PolicyDecodeServer

# A server made without its engine: LLMServer's async __del__ is never awaited then.
pytestmark = pytest.mark.filterwarnings("ignore:coroutine 'LLMServer.__del__':RuntimeWarning")

IDS = [1, 2, 3] + [32000] * 36 + [4, 5]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


def request(**extra: Any) -> Any:
    return ChatCompletionRequest.model_validate({
        "model": "llava", "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, IMAGE]}],
        **extra,
    })  # fmt: skip


def answer(kv: Any) -> Any:
    return ChatCompletionResponse.model_validate({
        "id": "p", "object": "chat.completion", "created": 0, "model": "llava",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": len(IDS), "completion_tokens": 1, "total_tokens": 42},
        "prompt_token_ids": IDS, "kv_transfer_params": kv,
    })  # fmt: skip


class Prefill:
    """A stand-in prefill handle: records what it was sent, answers ``reply``."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.sent: list[Any] = []
        self.chat = self

    def remote(self, prefill_request: Any, raw_request_info: Any) -> AsyncIterator[Any]:
        self.sent.append(prefill_request)

        async def answers() -> AsyncIterator[Any]:
            yield self.reply

        return answers()


def server(prefill: Prefill, capability: WorkerCapability) -> Any:
    made = PolicyDecodeServer.__new__(PolicyDecodeServer)
    made._prefill_handle = prefill
    made.capability, made.mrope, made.kv = capability, False, PrefillKv(KvConnectorMode.NIXL)
    return made


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The requests the local engine was given (it answers one chunk, "ok")."""
    seen: list[Any] = []

    async def chat(self: Any, decode_request: Any, raw_request_info: Any = None) -> Any:
        seen.append(decode_request)

        async def chunks() -> AsyncIterator[str]:
            yield "ok"

        return chunks()

    monkeypatch.setattr(LLMServer, "chat", chat)
    return seen


def run(made: Any, req: Any) -> list[Any]:
    async def collect() -> list[Any]:
        return [chunk async for chunk in made._pd_handle_request(req)]

    return asyncio.run(collect())


LM_ONLY = WorkerCapability(Support.FALSE)


def test_lm_only_decode_gets_the_stripped_leg(decoded: list[Any]) -> None:
    prefill = Prefill(answer({"transfer_id": "t"}))
    assert run(server(prefill, LM_ONLY), request()) == ["ok"]
    (sent,) = prefill.sent
    assert sent.max_tokens == 1 and sent.return_token_ids and sent.messages[0]["content"][1]
    (leg,) = decoded
    assert [p["type"] for p in leg.messages[0]["content"]] == ["text"]
    assert leg.kv_transfer_params == {"transfer_id": "t", "prompt_token_ids": IDS}
    assert leg.cache_salt.startswith("mm1:")


def test_no_kv_from_prefill_is_a_502_and_decode_never_runs(decoded: list[Any]) -> None:
    prefill = Prefill(answer(None))
    (error,) = run(server(prefill, LM_ONLY), request())
    assert isinstance(error, ErrorResponse)
    assert error.error.code == 502
    assert error.error.message.startswith("pd_decode_missing_kv_transfer_params: ")
    assert len(prefill.sent) == 1 and decoded == []


def test_a_refusal_calls_no_engine(decoded: list[Any]) -> None:
    prefill = Prefill(answer({"transfer_id": "t"}))
    (error,) = run(server(prefill, LM_ONLY), request(n=2))
    assert (error.error.code, error.error.message.split(":")[0]) == (
        400, "pd_decode_language_model_only_n_samples")  # fmt: skip
    assert prefill.sent == [] and decoded == []


def test_a_prefill_error_reaches_the_client_as_it_came(decoded: list[Any]) -> None:
    failed = ErrorResponse(error=ErrorInfo(message="boom", type="BadRequestError", code=400))
    prefill = Prefill(failed)
    assert run(server(prefill, LM_ONLY), request()) == [failed]
    assert decoded == []


def test_text_with_n_above_one_decodes_alone(decoded: list[Any]) -> None:
    prefill = Prefill(answer({"transfer_id": "t"}))
    text = ChatCompletionRequest.model_validate(
        {"model": "llava", "n": 2, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert run(server(prefill, LM_ONLY), text) == ["ok"]
    assert prefill.sent == [] and decoded[0].n == 2

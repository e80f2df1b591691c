"""The Ray decode server's request life, with a stand-in prefill handle and engine.

The live module beside it runs the real deployment; here, the faults a real
prefill deployment is not made to show in one session: a prefill that hands no KV, a
prefill that answers an error. Each test checks which legs ran.
"""

from __future__ import annotations

import asyncio
import json
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
    made.capability, made.mrope, made.kv = capability, False, PrefillKv(KvConnectorMode.TRANSFER)
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
    prefill = Prefill(answer({"do_remote_prefill": True, "transfer_id": "t"}))
    assert run(server(prefill, LM_ONLY), request()) == ["ok"]
    (sent,) = prefill.sent
    assert sent.max_tokens == 1 and sent.return_token_ids and sent.messages[0]["content"][1]
    (leg,) = decoded
    assert [p["type"] for p in leg.messages[0]["content"]] == ["text"]
    assert leg.kv_transfer_params == {
        "do_remote_prefill": True,
        "transfer_id": "t",
        "prompt_token_ids": IDS,
    }
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


# The M-RoPE metadata path: the prefill deployment renders and prefills (unary calls), the
# replica's own engine generates token-in and derenders.
TAKES_METADATA = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
RELAYED = {"do_remote_prefill": True, "transfer_id": "t"}
RENDERED: dict[str, Any] = {
    "request_id": "r", "token_ids": IDS, "model": "qwen2vl", "stream": False,
    "sampling_params": {"max_tokens": 4, "n": 1}, "cache_salt": None,
    "kv_transfer_params": None,
    "features": {"mm_hashes": {"image": ["ab" * 32]},
                 "mm_placeholders": {"image": [{"offset": 3, "length": 36}]},
                 "kwargs_data": {"image": ["PIXELS"]}, "mm_metadata": {"image": ["GRID"]}},
}  # fmt: skip
COMPLETION = {
    "id": "c", "object": "chat.completion", "created": 0, "model": "qwen2vl",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                 "finish_reason": "length"}],
    "usage": {"prompt_tokens": len(IDS), "completion_tokens": 1, "total_tokens": 42},
}  # fmt: skip


class Unary:
    """A stand-in for one method of a unary handle: records bodies, answers ``reply``."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.sent: list[Any] = []

    async def remote(self, body: Any) -> Any:
        self.sent.append(body)
        return self.reply


class MetadataPrefill:
    def __init__(self, render: Any = RENDERED, kv: Any = RELAYED) -> None:
        self.render_chat = Unary(render)
        prefilled = {"request_id": "r", "choices": [], "prompt_token_ids": IDS,
                     "kv_transfer_params": kv}  # fmt: skip
        self.generate = Unary(prefilled)


class Local:
    """A stand-in for the replica's ``ScaleOut``: two tokens, derendered one by one."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.fail_after = fail_after
        self.generated: list[Any] = []
        self.states: list[Any] = []

    async def generate(self, body: Any) -> Any:
        self.generated.append(body)
        return {"request_id": "r", "choices": [{"index": 0, "token_ids": [7, 8]}]}

    async def derender_whole(self, body: Any) -> Any:
        assert body["generate_response"]["choices"][0]["token_ids"] == [7, 8]
        return COMPLETION

    async def generate_stream(self, body: Any) -> AsyncIterator[Any]:
        self.generated.append(body)
        for n, token in enumerate((7, 8)):
            if n == self.fail_after:
                yield ErrorResponse(error=ErrorInfo(message="gone", type="E", code=500))
                return
            yield {"choices": [{"index": 0, "token_ids": [token]}]}

    async def derender_chunk(self, body: Any) -> Any:
        self.states.append(body["stream_state"])
        token = body["generate_chunk"]["choices"][0]["token_ids"][0]
        return {"choices": [{"delta": {"content": str(token)}}]}, {"seen": token}


def metadata_server(prefill: MetadataPrefill, local: Local) -> Any:
    made = server(Prefill(None), TAKES_METADATA)
    made.mrope, made.prefill_calls, made.local = True, prefill, local
    return made


def qwen(**extra: Any) -> Any:
    return request(model="qwen2vl", **extra)


def test_metadata_path_renders_prefills_and_derenders_a_whole_answer() -> None:
    prefill, local = MetadataPrefill(), Local()
    (answer,) = run(metadata_server(prefill, local), qwen(return_token_ids=True))
    assert isinstance(answer, ChatCompletionResponse)
    assert answer.prompt_token_ids == IDS  # the derender leaves them out; the client asked
    assert prefill.render_chat.sent[0]["messages"][0]["content"][1] == IMAGE
    (prefilled,) = prefill.generate.sent
    assert prefilled["features"]["kwargs_data"] == {"image": ["PIXELS"]}
    (decoded,) = local.generated
    assert decoded["features"]["kwargs_data"] == {"image": ["GRID"]}
    assert decoded["kv_transfer_params"]["transfer_id"] == "t"


def test_metadata_path_streams_chunks_threading_the_derender_state() -> None:
    local = Local()
    streamed = MetadataPrefill(render={**RENDERED, "stream": True})
    events = run(metadata_server(streamed, local), qwen(stream=True, return_token_ids=True))
    # The first chunk carries the prompt's ids, which the client asked for.
    head = json.loads(events[0].removeprefix("data: "))
    assert head.pop("prompt_token_ids") == IDS
    events[0] = f"data: {json.dumps(head, separators=(',', ':'))}\n\n"
    assert events == ['data: {"choices":[{"delta":{"content":"7"}}]}\n\n',
                      'data: {"choices":[{"delta":{"content":"8"}}]}\n\n',
                      "data: [DONE]\n\n"]  # fmt: skip
    assert local.states == [None, {"seen": 7}]


def test_metadata_prefill_without_kv_is_a_502_and_the_engine_never_runs() -> None:
    local = Local()
    (error,) = run(metadata_server(MetadataPrefill(kv=None), local), qwen())
    assert isinstance(error, ErrorResponse) and error.error.code == 502
    assert error.error.message.startswith("pd_decode_missing_kv_transfer_params: ")
    assert local.generated == []


def test_a_render_error_reaches_the_client_and_nothing_else_runs() -> None:
    failed = ErrorResponse(error=ErrorInfo(message="bad image", type="BadRequestError", code=400))
    prefill, local = MetadataPrefill(render=failed), Local()
    assert run(metadata_server(prefill, local), qwen()) == [failed]
    assert prefill.generate.sent == [] and local.generated == []


def test_a_render_without_grids_is_a_502_before_prefill() -> None:
    features = {**RENDERED["features"], "mm_metadata": None}
    prefill, local = MetadataPrefill(render={**RENDERED, "features": features}), Local()
    (error,) = run(metadata_server(prefill, local), qwen())
    assert isinstance(error, ErrorResponse) and error.error.code == 502
    assert prefill.generate.sent == [] and local.generated == []


def test_a_decode_failure_mid_stream_is_the_last_event() -> None:
    streamed = MetadataPrefill(render={**RENDERED, "stream": True})
    events = run(metadata_server(streamed, Local(fail_after=1)), qwen(stream=True))
    assert events[0].startswith("data: ") and isinstance(events[-1], ErrorResponse)
    assert len(events) == 2

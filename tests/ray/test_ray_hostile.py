"""Ray's decode server against a hostile caller: its router fields refused before any leg,
every leg under the server's own request id, and a caller that leaves releasing the legs.

The server runs its real request path (``_pd_handle_request``: the policy's plan, the
prefill through the prefill deployment's handle, the decode through Ray's ``LLMServer``
pipeline) against stand-ins for the handle and the pipeline that record what they are
sent; no Ray cluster, no engine.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, ClassVar

import pytest
from test_ray_legs import TAKES_METADATA, generated, render
from test_ray_legs import chat as image_chat

import pd_policy_ray.server
from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_ray.driver import serve
from pd_policy_ray.seam import ChatCompletionRequest, ErrorResponse
from pd_policy_ray.server import PolicyDecodeServer
from pd_policy_vllm.openai.plan.request import Route

LM_ONLY = WorkerCapability(Support.FALSE)
IDS = [1, 2, 3, 4, 5]
LIVENESS = 10.0


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}],
            **extra}  # fmt: skip


class Responses:
    """The prefill handle's streamed answer (a ``DeploymentResponseGenerator``): one reply,
    once ``gate`` is open; ``cancel`` is recorded."""

    def __init__(self, gate: asyncio.Event) -> None:
        self.gate = gate
        self.items: list[Any] = [
            {"id": "p", "choices": [{"index": 0, "message": {"content": "x"}}],
             "prompt_token_ids": IDS, "kv_transfer_params": {"transfer_id": "t"}, "usage": {}}
        ]  # fmt: skip
        self.cancelled = False

    def __aiter__(self) -> Responses:
        return self

    async def __anext__(self) -> Any:
        await self.gate.wait()
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


class Handle:
    """The prefill deployment's handle: every request it is sent, and each answer."""

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.answers: list[Responses] = []
        self.gate = asyncio.Event()
        self.gate.set()

    def options(self, **_: Any) -> Handle:
        return self

    @property
    def chat(self) -> Handle:
        return self

    def remote(self, request: Any, raw: Any = None) -> Responses:
        self.sent.append(request)
        self.answers.append(Responses(self.gate))
        return self.answers[-1]


class Pipeline:
    """Ray's ``LLMServer`` request pipeline on the local engine: every request it runs, and
    whether each stream was closed (its engine request ended) and when."""

    sent: ClassVar[list[Any]] = []
    closed: ClassVar[list[bool]] = []
    hold: ClassVar[asyncio.Event] = asyncio.Event()

    @classmethod
    def reset(cls) -> None:
        cls.sent, cls.closed, cls.hold = [], [], asyncio.Event()

    @classmethod
    async def chat(cls, server: Any, request: Any, raw: Any) -> AsyncGenerator[Any, None]:
        cls.sent.append(request)
        index = len(cls.closed)
        cls.closed.append(False)

        async def stream() -> AsyncGenerator[Any, None]:
            try:
                for token in ("a", "b", "c"):
                    yield f"data: {json.dumps({'token': token})}\n\n"
                    if cls.hold.is_set():
                        await asyncio.Event().wait()  # mid-stream, for good
            finally:
                cls.closed[index] = True

        return stream()

    completions = chat


class Server(PolicyDecodeServer):
    def __del__(self) -> None:  # LLMServer's own is a coroutine, for a started server
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Server:
    Pipeline.reset()
    monkeypatch.setattr(pd_policy_ray.server, "LLMServer", Pipeline)
    made = object.__new__(Server)
    made.capability, made.mrope, made.local = LM_ONLY, False, None
    made.kv = PrefillKv(KvConnectorMode.NIXL)
    made._prefill_handle = Handle()
    made.prefill_calls = None
    return made


def handle_of(server: Server) -> Handle:
    handle: Handle = server._prefill_handle
    return handle


def stream(server: Server, body: dict[str, Any]) -> AsyncIterator[Any]:
    request = ChatCompletionRequest.model_validate(body)
    items: AsyncIterator[Any] = server._pd_handle_request(request, None)
    return items


async def collect(server: Server, body: dict[str, Any]) -> list[Any]:
    return [item async for item in stream(server, body)]


# --- the router's fields ---------------------------------------------------------------

REFUSED = {
    "kv_transfer_params": {"kv_transfer_params": {"remote_host": "attacker.example"}},
    "ec_transfer_params": {"ec_transfer_params": {"remote_host": "attacker.example"}},
    "vllm_xargs.kv_transfer_params": {"vllm_xargs": {"kv_transfer_params": "attacker.example"}},
    "vllm_xargs.ec_transfer_params": {"vllm_xargs": {"ec_transfer_params": "attacker.example"}},
    "vllm_xargs.kv_cache_report_mode": {"vllm_xargs": {"kv_cache_report_mode": "all"}},
}


@pytest.mark.parametrize("n", [1, 2], ids=["p/d", "decode alone (n>1)"])
@pytest.mark.parametrize("field", list(REFUSED))
def test_a_callers_router_field_is_refused_before_any_leg(
    server: Server, field: str, n: int
) -> None:
    async def main() -> None:
        items = await collect(server, chat(n=n, **REFUSED[field]))
        assert handle_of(server).sent == [] and Pipeline.sent == []  # no leg at all
        (error,) = items
        assert isinstance(error, ErrorResponse)
        assert error.error.code == 400
        assert error.error.message.startswith("pd_router_owned_field: ")
        assert "attacker" not in error.error.message

    asyncio.run(main())


# --- request ids -----------------------------------------------------------------------


def test_every_leg_runs_under_the_servers_own_id(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        with caplog.at_level(logging.INFO, logger="ray.serve.pd_policy"):
            await collect(server, chat(request_id="chosen"))
        (prefill,) = handle_of(server).sent
        (decode,) = Pipeline.sent
        assert prefill.request_id == decode.request_id != "chosen"
        assert prefill.request_id.startswith("pd-")
        # Set explicitly, so that Ray's pipeline keeps it rather than stamping the Serve
        # request id (which a client chooses with its X-Request-Id header).
        assert "request_id" in prefill.model_fields_set
        assert "request_id" in decode.model_fields_set
        lines = [r.getMessage() for r in caplog.records]
        (line,) = [json.loads(m) for m in lines if m.startswith("{")]
        assert line["request_id"] == decode.request_id
        assert line["client_request_id"] == "chosen"  # the caller's, for its logs

    asyncio.run(main())


@pytest.mark.parametrize("n", [1, 2], ids=["p/d", "decode alone (n>1)"])
def test_two_callers_choosing_one_id_run_under_two(server: Server, n: int) -> None:
    async def main() -> None:
        handle_of(server).gate.clear()  # both held at the prefill, in flight at once
        tasks = [asyncio.ensure_future(collect(server, chat(n=n, request_id="same")))
                 for _ in range(2)]  # fmt: skip
        await asyncio.sleep(0.05)
        handle_of(server).gate.set()
        await asyncio.gather(*tasks)
        ids = [r.request_id for r in [*handle_of(server).sent, *Pipeline.sent]]
        assert "same" not in ids
        assert len({r.request_id for r in Pipeline.sent}) == 2

    asyncio.run(main())


# --- a caller that leaves --------------------------------------------------------------


async def until(condition: Any) -> None:
    async with asyncio.timeout(LIVENESS):
        while not condition():
            await asyncio.sleep(0.005)


def test_a_caller_that_leaves_during_the_prefill_cancels_it(server: Server) -> None:
    # Ray's handle does not cancel a call whose awaiting task is cancelled: the prefill
    # replica would run it (or queue it) for a caller that has gone.
    async def main() -> None:
        handle = handle_of(server)
        handle.gate.clear()
        task = asyncio.ensure_future(collect(server, chat()))
        await until(lambda: handle.answers)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [a.cancelled for a in handle.answers] == [True]
        assert Pipeline.sent == []

    asyncio.run(main())


@pytest.mark.parametrize("how", ["aclose", "cancel"])
def test_a_caller_that_leaves_mid_decode_ends_the_engines_request_at_once(
    server: Server, how: str
) -> None:
    async def main() -> None:
        Pipeline.hold.set()
        items = stream(server, chat(stream=True))
        if how == "aclose":
            await anext(items)
            await items.aclose()  # type: ignore[attr-defined]
        else:
            task = asyncio.ensure_future(anext(items))
            await until(lambda: Pipeline.sent)
            await task  # the first chunk
            task = asyncio.ensure_future(anext(items))
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        # Closed as the caller left, not whenever the collector gets to it.
        assert Pipeline.closed == [True]
        assert [a.cancelled for a in handle_of(server).answers] == [False]  # it had answered

    asyncio.run(main())


# --- the metadata path's handle calls ----------------------------------------------------


class Call:
    """A unary handle call (a ``DeploymentResponse``): its answer once ``gate`` opens."""

    def __init__(self, answer: Any, gate: asyncio.Event) -> None:
        self.answer, self.gate, self.cancelled = answer, gate, False

    def __await__(self) -> Any:
        return self._wait().__await__()

    async def _wait(self) -> Any:
        await self.gate.wait()
        return self.answer

    def cancel(self) -> None:
        self.cancelled = True


class Method:
    def __init__(self, answer: Any, gate: asyncio.Event) -> None:
        self.answer, self.gate = answer, gate
        self.sent: list[Any] = []
        self.calls: list[Call] = []

    def remote(self, body: Any) -> Call:
        self.sent.append(body)
        self.calls.append(Call(self.answer, self.gate))
        return self.calls[-1]


@pytest.mark.parametrize("held", ["render", "generate"])
def test_the_metadata_paths_calls_run_under_the_servers_id_and_are_cancelled_on_leaving(
    held: str,
) -> None:
    class Replica:
        capability, kv, mrope, local = TAKES_METADATA, PrefillKv(KvConnectorMode.NIXL), True, None

    async def main() -> None:
        open_, shut = asyncio.Event(), asyncio.Event()
        open_.set()
        replica: Any = Replica()
        replica.prefill_calls = type("Calls", (), {})()
        replica.prefill_calls.render_chat = Method(render(), shut if held == "render" else open_)
        replica.prefill_calls.generate = Method(generated(), shut)
        body = image_chat(request_id="chosen")
        served = serve(replica, Route.CHAT, body, "pd-own", None, lambda *_: None)
        task = asyncio.ensure_future(anext(served))
        calls: Method = getattr(replica.prefill_calls, held.replace("render", "render_chat"))
        await until(lambda: calls.calls)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert [c.cancelled for c in calls.calls] == [True]
        sent = [*replica.prefill_calls.render_chat.sent, *replica.prefill_calls.generate.sent]
        assert [b["request_id"] for b in sent] == ["pd-own"] * len(sent)

    asyncio.run(main())

"""When ``SequentialPd`` aborts which leg: at once before a handoff, never mid-handoff."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack

import pytest
from engines import LanguageModelOnlyDecodeEngine, PrefillEngine, serve
from proto_strategies import to_proto

import routers
from pd_policy import VisionSupport, WorkerCapability
from pd_policy.tools.scenarios import image_request
from pd_policy_grpc import SequentialPd
from routers import sequential_pd

LM_ONLY = WorkerCapability(VisionSupport.FALSE)


@pytest.fixture(autouse=True, params=routers.MODES)
def router_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test here runs against the router on messages and on bytes."""
    with routers.mode(request.param):
        yield


async def until(condition: asyncio.Event) -> None:
    await asyncio.wait_for(condition.wait(), timeout=5)


def run_with(
    p: PrefillEngine,
    d: LanguageModelOnlyDecodeEngine,
    body: Callable[[SequentialPd], Awaitable[None]],
    *,
    deferred_abort_max_wait: float = 30.0,
) -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            p_channel = await stack.enter_async_context(serve(p))
            d_channel = await stack.enter_async_context(serve(d))
            pd = sequential_pd(
                p_channel, d_channel, LM_ONLY, timeout=10,
                deferred_abort_max_wait=deferred_abort_max_wait,
            )  # fmt: skip
            await body(pd)

    asyncio.run(main())


async def consume(pd: SequentialPd) -> None:
    async for _ in pd.generate(to_proto(image_request())):
        pass


def test_a_cancel_during_prefill_aborts_the_prefill_at_once() -> None:
    p, d = PrefillEngine(), LanguageModelOnlyDecodeEngine()
    p.hold_first.set()

    async def body(pd: SequentialPd) -> None:
        task = asyncio.create_task(consume(pd))
        await until(p.waiting)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Aborted under the id the leg ran under: the router's, never the caller's.
        (leg,) = p.requests
        assert p.aborted == [leg.request_id] != ["req-1"]
        assert d.requests == [] and d.aborted == []  # decode was never sent

    run_with(p, d, body)


def test_a_decode_dropped_before_its_first_response_is_aborted_after_it() -> None:
    p, d = PrefillEngine(), LanguageModelOnlyDecodeEngine()
    d.hold_first.set()

    async def body(pd: SequentialPd) -> None:
        task = asyncio.create_task(consume(pd))
        await until(d.waiting)  # decode is running; its KV transfer may be in flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.2)
        assert d.aborted == []  # not mid-handoff
        d.release.set()  # the first response proves the handoff finished
        await pd.aclose()
        assert d.aborted == [d.requests[0].request_id] != ["req-1"]
        assert p.aborted == []  # the prefill had completed

    run_with(p, d, body)


def test_a_deferred_abort_gives_up_waiting_after_its_limit() -> None:
    p, d = PrefillEngine(), LanguageModelOnlyDecodeEngine()
    d.hold_first.set()  # never released: the first response never comes

    async def body(pd: SequentialPd) -> None:
        task = asyncio.create_task(consume(pd))
        await until(d.waiting)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert d.aborted == []
        await asyncio.wait_for(pd.aclose(), timeout=5)
        assert d.aborted == [d.requests[0].request_id]

    run_with(p, d, body, deferred_abort_max_wait=0.3)

"""A caller of ``FleetPd`` that leaves at any point releases the load its request held.

Each member's load (``outstanding``) is what placement balances by: a request that left
without releasing it would count against its members for good, and every request after
it would be placed as if they were busier than they are. A caller leaves by cancelling
its task, by closing the generator, or by dropping it unclosed (the event loop's hooks
close it once it is collected); at each point of the request's life (before its first
iteration, while the prefill runs, as the prefill answers, while the decode's first
response is awaited, mid-stream, after the first response), the roster's load reads
zero afterwards, no member's health counts it, and the next requests spread as on a
fleet that never saw it.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import pytest
from engines import LanguageModelOnlyDecodeEngine, PrefillEngine, serve_address
from proto_strategies import to_proto

import grpc
from pd_policy import Health, HealthState, WorkerStreamError
from pd_policy.tools.scenarios import text_request
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.fleet import FleetPd, describe_worker
from pd_policy_grpc.raw import SequentialPdBytes
from pd_policy_grpc.wire import pb

LIVENESS = 10.0


class Prefill(PrefillEngine):
    """A prefill that holds before answering when told, and says when it has answered."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = asyncio.Event()

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        async for item in super().Generate(request, context):
            yield item
        self.answered.set()


class Decode(LanguageModelOnlyDecodeEngine):
    """A decode whose ``Abort`` holds until ``abort_release`` when ``abort_hold`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.abort_hold = False
        self.aborting = asyncio.Event()
        self.abort_release = asyncio.Event()

    async def Abort(self, request: pb.AbortRequest, context: Any) -> pb.AbortResponse:  # noqa: N802
        if self.abort_hold:
            self.aborting.set()
            await self.abort_release.wait()
        return await super().Abort(request, context)


Stand = tuple[FleetPd, list[Prefill], list[Decode]]
Leave = Callable[[Stand, Callable[[], Any]], Awaitable[None]]


def run(bytes_router: bool, test: Callable[[Stand], Awaitable[None]]) -> None:
    async def main() -> None:
        pair = SequentialPdBytes if bytes_router else SequentialPd
        fleet = FleetPd(router=pair, attempts=2)
        ps = [Prefill() for _ in range(2)]
        ds = [Decode() for _ in range(2)]
        async with AsyncExitStack() as stack:
            for role, engines in (("prefill", ps), ("decode", ds)):
                for engine in engines:
                    address = await stack.enter_async_context(serve_address(engine))
                    channel = await stack.enter_async_context(grpc.aio.insecure_channel(address))
                    fleet.add(role, await describe_worker(channel, address, role))
            await test((fleet, ps, ds))
            for held in (*ps, *ds):
                held.release.set()
            for d in ds:
                d.abort_release.set()
            await fleet.aclose()

    asyncio.run(main())


def request(fleet: FleetPd, rid: str) -> Any:
    message = to_proto(text_request(request_id=rid))
    return message.SerializeToString() if fleet.router is SequentialPdBytes else message


async def until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(LIVENESS):
        while not condition():
            await asyncio.sleep(0.005)


def load(fleet: FleetPd) -> dict[str, int]:
    return {m.name: m.outstanding for m in fleet.roster}


async def drain(fleet: FleetPd) -> None:
    """The event loop's own steps, until the roster holds no load (or the bound passes)."""
    await until(lambda: not any(load(fleet).values()))


# --- how a caller leaves, at each point ------------------------------------------------


async def consume(fleet: FleetPd, rid: str, first: asyncio.Event | None = None) -> None:
    async for _ in fleet.generate(request(fleet, rid)):
        if first is not None:
            first.set()


async def cancelled_before_its_first_iteration(stand: Stand) -> None:
    fleet = stand[0]
    stream = fleet.generate(request(fleet, "never"))
    task = asyncio.ensure_future(anext(stream))
    task.cancel()  # before the generator's body ever ran
    with pytest.raises(asyncio.CancelledError):
        await task
    await stream.aclose()


async def closed_before_its_first_iteration(stand: Stand) -> None:
    fleet = stand[0]
    await fleet.generate(request(fleet, "never")).aclose()


async def cancelled_while_the_prefill_runs(stand: Stand) -> None:
    fleet, ps, _ = stand
    for p in ps:
        p.hold_first.set()
    task = asyncio.ensure_future(consume(fleet, "mid-prefill"))
    await until(lambda: any(p.waiting.is_set() for p in ps))
    assert sum(load(fleet).values()) == 2  # the attempt holds its prefill and decode
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def cancelled_as_the_prefill_answers(stand: Stand) -> None:
    fleet, ps, ds = stand
    for d in ds:
        d.hold_first.set()  # so that the request cannot be over before the cancel
    task = asyncio.ensure_future(consume(fleet, "between"))
    await until(lambda: any(p.answered.is_set() for p in ps))
    task.cancel()  # wherever the router is between the prefill's answer and the decode
    with pytest.raises(asyncio.CancelledError):
        await task


async def cancelled_awaiting_the_first_decode_response(stand: Stand) -> None:
    fleet, _, ds = stand
    for d in ds:
        d.hold_first.set()
    task = asyncio.ensure_future(consume(fleet, "first"))
    await until(lambda: any(d.waiting.is_set() for d in ds))
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def cancelled_mid_stream(stand: Stand) -> None:
    fleet, _, ds = stand
    for d in ds:
        d.hold.set()
    first = asyncio.Event()
    task = asyncio.ensure_future(consume(fleet, "mid-stream", first))
    await until(first.is_set)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def cancelled_again_while_its_legs_are_aborted(stand: Stand) -> None:
    fleet, _, ds = stand
    for d in ds:
        d.hold.set()
        d.abort_hold = True
    first = asyncio.Event()
    task = asyncio.ensure_future(consume(fleet, "twice", first))
    await until(first.is_set)
    task.cancel()
    await until(lambda: any(d.aborting.is_set() for d in ds))  # its cleanup awaits the abort
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for d in ds:
        d.abort_hold = False
        d.abort_release.set()
        d.aborting.clear()


async def closed_after_the_first_response(stand: Stand) -> None:
    fleet, _, ds = stand
    for d in ds:
        d.hold.set()
    stream = fleet.generate(request(fleet, "closed"))
    await anext(stream)
    await stream.aclose()


async def broke_out_after_the_first_response(stand: Stand) -> None:
    fleet = stand[0]
    async for _ in fleet.generate(request(fleet, "broke")):
        break  # the generator is left to the loop: no aclose


async def abandoned_unclosed_after_the_first_response(stand: Stand) -> None:
    fleet, _, ds = stand
    for d in ds:
        d.hold.set()
    stream = fleet.generate(request(fleet, "abandoned"))
    await anext(stream)
    del stream  # never closed: the loop's hooks close it once it is collected
    gc.collect()


LEAVES = [
    cancelled_before_its_first_iteration,
    closed_before_its_first_iteration,
    cancelled_while_the_prefill_runs,
    cancelled_as_the_prefill_answers,
    cancelled_awaiting_the_first_decode_response,
    cancelled_mid_stream,
    cancelled_again_while_its_legs_are_aborted,
    closed_after_the_first_response,
    broke_out_after_the_first_response,
    abandoned_unclosed_after_the_first_response,
]


@pytest.mark.parametrize("bytes_router", [False, True], ids=["message", "bytes"])
@pytest.mark.parametrize("leave", LEAVES, ids=lambda f: f.__name__)
def test_a_caller_that_leaves_releases_its_load(bytes_router: bool, leave: Any) -> None:
    async def test(stand: Stand) -> None:
        fleet, ps, ds = stand
        before = {m.name: m.health for m in fleet.roster}
        for _ in range(3):  # the same way out, again and again: nothing piles up
            await leave(stand)
            for engine in (*ps, *ds):
                engine.hold.clear()
                engine.hold_first.clear()
                engine.release.set()
            await drain(fleet)
            for engine in (*ps, *ds):
                engine.release.clear()
                engine.waiting.clear()
        assert load(fleet) == dict.fromkeys(load(fleet), 0)
        # No member's health counts a caller that left.
        assert {m.name: m.health for m in fleet.roster} == before
        assert all(h == HealthState(Health.HEALTHY) for h in before.values())
        # The next requests spread as on a fleet that never saw the ones that left: four
        # held at once are two on each prefill and two on each decode.
        for p in ps:
            p.hold_first.set()
        seen = sum(len(p.requests) for p in ps)
        tasks = [asyncio.ensure_future(consume(fleet, f"next-{i}")) for i in range(4)]
        await until(lambda: sum(len(p.requests) for p in ps) == seen + 4)
        assert sorted(load(fleet).values()) == [2, 2, 2, 2]
        for p in ps:
            p.release.set()
        await asyncio.gather(*tasks)

    run(bytes_router, test)


@pytest.mark.parametrize("bytes_router", [False, True], ids=["message", "bytes"])
@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_channel_closed_under_a_request_releases_its_load(bytes_router: bool, role: str) -> None:
    # A member removed (its channel closed) while a request runs on it: the request ends
    # with the leg's typed failure (or, before any byte, is retried on another member),
    # never a bare gRPC error, and its load is released, the other member's too.
    async def test(stand: Stand) -> None:
        fleet, ps, ds = stand
        engines: list[Any] = ps if role == "prefill" else ds
        for engine in engines:
            engine.hold_first.set() if role == "prefill" else engine.hold.set()
        first = asyncio.Event()
        task = asyncio.ensure_future(consume(fleet, "cut", first))
        if role == "prefill":
            await until(lambda: any(p.waiting.is_set() for p in ps))
        else:
            await until(first.is_set)
        (busy,) = [m for m in fleet.roster.of(role) if m.outstanding]
        await busy.worker.channel.close()
        for engine in engines:
            engine.hold.clear()
            engine.hold_first.clear()
            engine.release.set()
        outcome = (await asyncio.gather(task, return_exceptions=True))[0]
        assert load(fleet) == dict.fromkeys(load(fleet), 0)  # released as it ended
        if role == "prefill":
            assert outcome is None  # retried on the other prefill, before any byte
            assert busy.health.failed == 1
        else:
            assert isinstance(outcome, WorkerStreamError), outcome
            assert (outcome.leg, outcome.status) == ("decode", 503)

    run(bytes_router, test)

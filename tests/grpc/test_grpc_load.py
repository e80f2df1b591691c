"""``SequentialPd`` under load, with faults mixed in: every leg settled, nothing leaked.

Each test drives ``LOAD`` concurrent image requests through one ``SequentialPd``
against loopback engines (:mod:`faulty_engines`), some of them faulty, and then
checks, besides each request's own outcome:

* every leg an engine started was completed or aborted (the engines' ledgers),
  as soon as :meth:`SequentialPd.aclose` returns;
* no stream is left open on either engine;
* no asyncio task is left over: the tasks running afterwards are the ones that
  ran before, counted by coroutine (the servers replace their accept tasks);
* memory returns to its baseline (``MEMORY_BOUND``).

No assertion reads a clock: a test waits for events (an engine holding a
stream, a response arriving), and the only time limits are liveness bounds
that fail a hung test instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import random
import tracemalloc
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import AsyncExitStack
from typing import Any

import attrs
import pytest
from engines import answer, serve
from faulty_engines import Fault, FaultyDecode, FaultyPrefill, kv_json, tag
from proto_strategies import to_proto

import grpc
import routers
from pd_policy import VisionSupport, WorkerCapability, WorkerFailedToStart, WorkerStreamError
from pd_policy.tools.scenarios import image_request
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.wire import pb
from routers import sequential_pd

LM_ONLY = WorkerCapability(VisionSupport.FALSE)
#: Concurrent requests in the load test, and in each fault test (healthy and faulty
#: together): the fault tests run at half the load, to keep the module fast on 2 cores.
LOAD = 500
FAULT_LOAD = 250
#: The deadline of the router whose calls time out. Its faulty requests reach the
#: engines' hold points within milliseconds of starting, so the margin is large; the
#: healthy load runs through another router without a deadline, so that it never races
#: one on a busy 2-core machine.
DEADLINE = 2.0
#: Python memory a test may hold after its load, over the baseline taken after a warm-up
#: load of the same size. Measured, it is 10-50 KiB: a few proto and grpc caches, and the
#: set behind asyncio.all_tasks(), which keeps the size it grew to. A leaked request
#: keeps at least its task, its coroutine frame and its gRPC call (several KiB), so
#: leaking even one request in ten (50 of 500) costs more than this bound.
MEMORY_BOUND = 256 * 1024
#: How long a test waits for something that should happen (the engines holding the
#: faulty streams, the servers closing their streams) before it fails, instead of hanging.
LIVENESS = 30.0


@pytest.fixture(autouse=True, params=routers.MODES)
def router_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test here runs against the router on messages and on bytes."""
    with routers.mode(request.param):
        yield


@attrs.define
class Rig:
    """The engines, their channels and the routers a test drives."""

    prefill: FaultyPrefill
    decode: FaultyDecode
    channels: tuple[grpc.aio.Channel, grpc.aio.Channel]
    pd: SequentialPd
    others: list[SequentialPd] = attrs.field(factory=list)

    def router(self, **kwargs: Any) -> SequentialPd:
        """Another router over the same channels; the harness closes it too."""
        pd = sequential_pd(*self.channels, LM_ONLY, **kwargs)
        self.others.append(pd)
        return pd


def requests(groups: dict[str, int], size: int = FAULT_LOAD) -> dict[str, pb.GenerateRequest]:
    """``size`` image requests by id: ``groups[g]`` of them with ids ``g-<i>``, the
    rest ``ok-<i>``, interleaved in a fixed random order so faults land mid-load."""
    kinds = [g for g, n in groups.items() for _ in range(n)]
    kinds += ["ok"] * (size - len(kinds))
    random.Random(0).shuffle(kinds)
    return {
        f"{kind}-{i}": tag(
            to_proto(image_request(images=(f"img-{i % 7}.jpg",), request_id=f"{kind}-{i}"))
        )
        for i, kind in enumerate(kinds)
    }


def group(ids: Iterable[str], kind: str) -> list[str]:
    """The ids of ``kind`` (``"ok"``, or a group name given to :func:`requests`)."""
    return [rid for rid in ids if rid.startswith(f"{kind}-")]


def expected_tokens(request: pb.GenerateRequest) -> list[int]:
    """What the decode engine answers when the leg it gets is right: the request's ids
    and hashes, no pixels, and the KV parameters the prefill returned for this request."""
    leg = pb.GenerateRequest(kv_transfer_params_json=kv_json(request.request_id))
    leg.tokenized.input_ids.extend(request.tokenized.input_ids)
    leg.mm_inputs.mm_hashes.extend(request.mm_inputs.mm_hashes)
    return answer(leg)


async def consume(
    pd: SequentialPd, request: pb.GenerateRequest, first: asyncio.Event | None = None
) -> list[pb.GenerateResponse]:
    responses = []
    async for response in pd.generate(request):
        responses.append(response)
        if first is not None:
            first.set()
    return responses


async def gather(tasks: dict[str, asyncio.Task[list[pb.GenerateResponse]]]) -> dict[str, Any]:
    """Each task's responses, or the exception it ended with, by request id."""
    outcomes = await asyncio.gather(*tasks.values(), return_exceptions=True)
    return dict(zip(tasks, outcomes, strict=True))


def start(
    pd: SequentialPd,
    load: dict[str, pb.GenerateRequest],
    firsts: dict[str, asyncio.Event] | None = None,
) -> dict[str, asyncio.Task[list[pb.GenerateResponse]]]:
    """One task per request; ``firsts[rid]`` is set when ``rid``'s first response arrives."""
    firsts = firsts or {}
    return {
        rid: asyncio.create_task(consume(pd, request, firsts.get(rid)))
        for rid, request in load.items()
    }


def assert_answered(load: dict[str, pb.GenerateRequest], outcomes: dict[str, Any]) -> None:
    """Every ``ok-`` request got its own answer, token by token and in its completion."""
    for rid in group(load, "ok"):
        responses = outcomes[rid]
        assert isinstance(responses, list), (rid, responses)
        want = expected_tokens(load[rid])
        assert [t for r in responses[:-1] for t in r.chunk.token_ids] == want, rid
        assert list(responses[-1].complete.output_ids) == want, rid


def assert_failed(
    outcomes: dict[str, Any], ids: list[str], error: type[WorkerFailedToStart], leg: str,
    grpc_status: str, http_status: int,
) -> None:  # fmt: skip
    """Every request of ``ids`` failed with exactly ``error`` for ``leg`` and ``grpc_status``
    (a subclass, or a bare ``grpc.aio.AioRpcError``, fails)."""
    assert ids
    for rid in ids:
        exc = outcomes[rid]
        assert type(exc) is error, (rid, exc)
        assert (exc.leg, exc.grpc_status, exc.status) == (leg, grpc_status, http_status), rid


@contextlib.contextmanager
def quiet(logger: str) -> Iterator[None]:
    """Silence ``logger``: pytest keeps every record for its report, and the record of a
    crashed handler holds its traceback, frames and all, which the memory check would see."""
    log = logging.getLogger(logger)
    log.disabled = True
    try:
        yield
    finally:
        log.disabled = False


def task_census() -> collections.Counter[str]:
    """The running tasks other than this one, counted by coroutine name."""
    current = asyncio.current_task()
    return collections.Counter(
        getattr(t.get_coro(), "__qualname__", repr(t.get_coro()))
        for t in asyncio.all_tasks()
        if t is not current
    )


async def settle(rig: Rig, census: collections.Counter[str]) -> None:
    """Wait until both engines have closed every stream and the tasks are ``census``."""
    async with asyncio.timeout(LIVENESS):
        while rig.prefill.open_streams or rig.decode.open_streams or task_census() != census:
            await asyncio.sleep(0.01)


def run(scenario: Callable[[Rig], Awaitable[None]], size: int = FAULT_LOAD) -> None:
    """Serve the engines, warm up with ``size`` healthy requests, then run ``scenario`` and
    check that every leg settled, no stream or task is left over and memory returned to its
    baseline."""

    async def main() -> None:
        prefill, decode = FaultyPrefill(), FaultyDecode()
        async with AsyncExitStack() as stack:
            p_channel = await stack.enter_async_context(serve(prefill))
            d_channel = await stack.enter_async_context(serve(decode))
            pd = sequential_pd(p_channel, d_channel, LM_ONLY, deferred_abort_max_wait=LIVENESS)
            rig = Rig(prefill, decode, (p_channel, d_channel), pd)
            # The same load once, untraced: caches and the containers that grow with
            # concurrency reach their size before the baseline is taken.
            census = task_census()
            warm = requests({}, size)
            assert_answered(warm, await gather(start(pd, warm)))
            del warm
            await settle(rig, census)
            prefill.clear()
            decode.clear()
            gc.collect()
            tracemalloc.start()
            try:
                await checked(rig, census, scenario)
                prefill.clear()
                decode.clear()
                # A new step of the loop: the one that resumed us still holds what woke it.
                await asyncio.sleep(0)
                gc.collect()
                retained, _ = tracemalloc.get_traced_memory()
                top = "\n".join(map(str, tracemalloc.take_snapshot().statistics("lineno")[:8]))
            finally:
                tracemalloc.stop()
            assert retained < MEMORY_BOUND, f"{retained / 1024:.0f} KiB retained:\n{top}"

    asyncio.run(main())


async def checked(
    rig: Rig, census: collections.Counter[str], scenario: Callable[[Rig], Awaitable[None]]
) -> None:
    await scenario(rig)
    for pd in [rig.pd, *rig.others]:
        await pd.aclose()
    # Checked before anything else runs: aclose's contract is that the deferred aborts
    # went out, not that they will.
    assert rig.prefill.unsettled() == set(), "prefill legs neither completed nor aborted"
    assert rig.decode.unsettled() == set(), "decode legs neither completed nor aborted"
    with contextlib.suppress(TimeoutError):  # the assertions below say what is left
        await settle(rig, census)
    assert (rig.prefill.open_streams, rig.decode.open_streams) == (0, 0), "streams left open"
    assert task_census() - census == collections.Counter(), "tasks left over"
    assert census - task_census() == collections.Counter(), "tasks gone"


# --- the load ------------------------------------------------------------------------


def test_500_concurrent_image_requests_are_all_answered() -> None:
    async def scenario(rig: Rig) -> None:
        load = requests({}, LOAD)
        outcomes = await gather(start(rig.pd, load))
        assert_answered(load, outcomes)
        assert sorted(rig.prefill.completed) == sorted(load) == sorted(rig.decode.completed)
        assert rig.prefill.aborted == [] and rig.decode.aborted == []
        # Every leg ran under an id of the router's own: one per request, none a caller's.
        for engine in (rig.prefill, rig.decode):
            assert len(engine.callers) == LOAD and not set(engine.callers) & set(load)

    run(scenario, LOAD)


# --- faults --------------------------------------------------------------------------


def test_a_prefill_that_dies_mid_call_fails_its_request_alone() -> None:
    groups = {"before": 15, "after": 15, "close": 15, "crash": 15}

    async def scenario(rig: Rig) -> None:
        load = requests(groups)
        faults = {"before": Fault.DIE_BEFORE_OUTPUT, "after": Fault.DIE_AFTER_OUTPUT,
                  "close": Fault.CLOSE_EARLY, "crash": Fault.CRASH}  # fmt: skip
        for name, fault in faults.items():
            rig.prefill.faults.update(dict.fromkeys(group(load, name), fault))
        with quiet("grpc._cython.cygrpc"):
            outcomes = await gather(start(rig.pd, load))
        assert_answered(load, outcomes)
        fail = WorkerFailedToStart
        assert_failed(outcomes, group(load, "before"), fail, "prefill", "INTERNAL", 500)
        assert_failed(outcomes, group(load, "after"), WorkerStreamError, "prefill", "INTERNAL", 500)
        assert_failed(outcomes, group(load, "close"), WorkerStreamError, "prefill", "INTERNAL", 500)
        assert all("without a completion" in outcomes[r].detail for r in group(load, "close"))
        assert_failed(outcomes, group(load, "crash"), WorkerStreamError, "prefill", "UNKNOWN", 500)
        failed = set(load) - set(group(load, "ok"))
        assert set(rig.prefill.aborted) == failed  # every failed prefill, and only those
        assert failed.isdisjoint(rig.decode.started)  # no decode without a handoff

    run(scenario)


def test_a_decode_that_returns_unavailable_fails_its_request_alone() -> None:
    async def scenario(rig: Rig) -> None:
        load = requests({"refused": 30, "dropped": 30})
        rig.decode.fault_status = grpc.StatusCode.UNAVAILABLE
        rig.decode.faults.update(dict.fromkeys(group(load, "refused"), Fault.DIE_BEFORE_OUTPUT))
        rig.decode.faults.update(dict.fromkeys(group(load, "dropped"), Fault.DIE_AFTER_OUTPUT))
        outcomes = await gather(start(rig.pd, load))
        assert_answered(load, outcomes)
        refused, dropped = group(load, "refused"), group(load, "dropped")
        assert_failed(outcomes, refused, WorkerFailedToStart, "decode", "UNAVAILABLE", 503)
        assert_failed(outcomes, dropped, WorkerStreamError, "decode", "UNAVAILABLE", 503)
        assert all(outcomes[rid].retryable for rid in refused + dropped)
        # The prefills had completed: nothing to abort there; the failed decodes are aborted.
        assert rig.prefill.aborted == []
        assert set(rig.decode.aborted) == {*refused, *dropped}

    run(scenario)


def test_a_deadline_that_passes_while_an_engine_holds_fails_its_request_alone() -> None:
    async def scenario(rig: Rig) -> None:
        load = requests({"prefill": 20, "first": 20, "last": 20})
        held_prefill, held_first, held_last = (group(load, g) for g in ("prefill", "first", "last"))
        rig.prefill.faults.update(dict.fromkeys(held_prefill, Fault.HOLD_FIRST))
        rig.decode.faults.update(dict.fromkeys(held_first, Fault.HOLD_FIRST))
        rig.decode.faults.update(dict.fromkeys(held_last, Fault.HOLD_LAST))
        late = {rid: load[rid] for rid in [*held_prefill, *held_first, *held_last]}
        firsts = {rid: asyncio.Event() for rid in held_last}
        short = rig.router(timeout=DEADLINE)
        tasks = start(short, late, firsts)
        # Everything that will time out is at its hold point before the load starts.
        async with asyncio.timeout(LIVENESS):
            await rig.prefill.until_holding(len(held_prefill))
            await rig.decode.until_holding(len(held_first) + len(held_last))
            await asyncio.gather(*(e.wait() for e in firsts.values()))
        tasks |= start(rig.pd, {rid: r for rid, r in load.items() if rid not in late})
        outcomes = await gather(tasks)
        assert_answered(load, outcomes)
        fail, stream = WorkerFailedToStart, WorkerStreamError
        assert_failed(outcomes, held_prefill, fail, "prefill", "DEADLINE_EXCEEDED", 504)
        assert_failed(outcomes, held_first, fail, "decode", "DEADLINE_EXCEEDED", 504)
        assert_failed(outcomes, held_last, stream, "decode", "DEADLINE_EXCEEDED", 504)
        assert set(rig.prefill.aborted) == set(held_prefill)
        assert set(rig.decode.aborted) == {*held_first, *held_last}

    run(scenario)


def test_a_client_that_cancels_mid_prefill_aborts_the_prefill() -> None:
    async def scenario(rig: Rig) -> None:
        load = requests({"first": 30, "last": 30})
        held = group(load, "first") + group(load, "last")
        rig.prefill.faults.update(dict.fromkeys(group(load, "first"), Fault.HOLD_FIRST))
        rig.prefill.faults.update(dict.fromkeys(group(load, "last"), Fault.HOLD_LAST))
        tasks = start(rig.pd, load)
        await rig.prefill.until_holding(len(held))
        for rid in held:
            tasks[rid].cancel()
        outcomes = await gather(tasks)
        assert_answered(load, outcomes)
        assert all(isinstance(outcomes[rid], asyncio.CancelledError) for rid in held)
        # At once: the cancelled requests had finished, and their aborts with them.
        assert set(rig.prefill.aborted) == set(held)
        assert set(held).isdisjoint(rig.decode.started)

    run(scenario)


def test_a_client_that_cancels_mid_decode_aborts_the_decode_once_its_handoff_is_over() -> None:
    async def scenario(rig: Rig) -> None:
        load = requests({"first": 30, "last": 30})
        first, last = group(load, "first"), group(load, "last")
        rig.decode.faults.update(dict.fromkeys(first, Fault.HOLD_FIRST))
        rig.decode.faults.update(dict.fromkeys(last, Fault.HOLD_LAST))
        firsts = {rid: asyncio.Event() for rid in last}
        tasks = start(rig.pd, load, firsts)
        async with asyncio.timeout(LIVENESS):
            await rig.decode.until_holding(len(first) + len(last))
            await asyncio.gather(*(e.wait() for e in firsts.values()))
        for rid in first + last:
            tasks[rid].cancel()
        outcomes = await gather(tasks)
        assert_answered(load, outcomes)
        assert all(isinstance(outcomes[rid], asyncio.CancelledError) for rid in first + last)
        # After a first response the handoff is over: aborted at once. Before it, the KV
        # transfer may be in flight: not aborted until the response comes.
        assert set(rig.decode.aborted) == set(last)
        assert rig.decode.holding == set(first)
        rig.decode.release.set()  # the first responses come: the handoffs are over
        await rig.pd.aclose()
        assert set(rig.decode.aborted) == {*first, *last}
        assert rig.prefill.aborted == []  # every prefill had completed

    run(scenario)

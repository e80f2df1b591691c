"""``FleetPd`` over in-process engines on loopback: load spread, media affinity, retries only
before the first response, ejection by probe and re-admission as what a worker is now.

The real servicer fleet is in ``tests/vllm/smg/test_smg_llava.py``; these are the faults a
real worker cannot be made to show on demand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import attrs
import pytest
from engines import LanguageModelOnlyDecodeEngine, PrefillEngine, answer, serve_address
from proto_strategies import to_proto

import grpc
from docs_examples import load_route
from pd_policy import (
    Health,
    HealthPolicy,
    KvConnectorMode,
    MropeOnLanguageModelOnlyDecode,
    NoWorkerAvailable,
    PolicyError,
    Roster,
    Support,
    WorkerCapability,
    WorkerFailedToStart,
    rendezvous_order,
)
from pd_policy.tools.scenarios import image_request, mrope_request, text_request
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.fleet import FleetPd, GrpcWorker, PairRouter, describe_worker
from pd_policy_grpc.raw.client import SequentialPdBytes
from pd_policy_grpc.wire import pb


class Decode(LanguageModelOnlyDecodeEngine):
    """A language-model-only decode whose next answers, health and kind the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next: list[grpc.StatusCode] = []
        self.cut_after_first = False

    async def refuse(self, request: pb.GenerateRequest, context: Any) -> None:
        if not self.supports_vision:  # restarted with its vision tower, it takes media
            await super().refuse(request, context)

    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        if self.fail_next:
            self.requests.append(request)
            await context.abort(self.fail_next.pop(0), "busy")
        if self.cut_after_first:
            self.requests.append(request)
            yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[1]))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "gone")
        async for item in super().Generate(request, context):
            yield item


Clock = list[float]
Test = Callable[[FleetPd, list[PrefillEngine], list[Decode], Clock], Awaitable[None]]


def run(test: Test, *, prefills: int = 2, decodes: int = 2, bytes_router: bool = False) -> None:
    async def main() -> None:
        now: Clock = [0.0]
        roster: Roster[GrpcWorker] = Roster(clock=lambda: now[0], policy=HealthPolicy(failures=2))
        router: PairRouter = SequentialPdBytes if bytes_router else SequentialPd
        fleet = FleetPd(roster, router=router, attempts=2)
        ps, ds = [PrefillEngine() for _ in range(prefills)], [Decode() for _ in range(decodes)]
        async with AsyncExitStack() as stack:
            for role, engines in (("prefill", ps), ("decode", ds)):
                for engine in engines:
                    address = await stack.enter_async_context(serve_address(engine))
                    channel = await stack.enter_async_context(grpc.aio.insecure_channel(address))
                    fleet.add(role, await describe_worker(channel, address, role))
            await test(fleet, ps, ds, now)
            await fleet.aclose()

    asyncio.run(main())


def health(member: Any) -> Health:
    """A member's health now (a call, so that no check narrows it for the next)."""
    state: Health = member.health.health
    return state


async def served(fleet: FleetPd, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [r async for r in fleet.generate(request)]


def image(seed: int, rid: str) -> pb.GenerateRequest:
    """A LLaVA-style image request for the image named by ``seed``."""
    return to_proto(image_request(images=(f"image-{seed}.png",), request_id=rid))


def test_the_fleet_is_read_from_each_workers_own_answers() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        (p, _), (d, _) = fleet.roster.of("prefill"), fleet.roster.of("decode")
        assert p.worker.kv is not None and p.worker.kv.mode is KvConnectorMode.NIXL
        assert p.name.startswith("127.0.0.1:") and p.worker.kv.bootstrap_host == "127.0.0.1"
        assert (
            d.worker.capability.language_model_only and not p.worker.capability.language_model_only
        )

    run(test)


@pytest.mark.parametrize("bytes_router", [False, True])
def test_concurrent_requests_spread_and_one_images_requests_keep_their_prefill(
    bytes_router: bool,
) -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        serve_one = served_bytes if bytes_router else served
        answers = await asyncio.gather(*(serve_one(fleet, image(i, f"r{i}")) for i in range(8)))
        assert all(answers)
        assert all(len(d.requests) >= 2 for d in ds)  # the decodes shared the load
        assert all(len(p.requests) >= 2 for p in ps)
        # One at a time, each image's requests go to one prefill, its prefix cache's.
        for seed in [*range(10, 18)] * 2:
            await serve_one(fleet, image(seed, f"again-{seed}-{len(ps[0].requests)}"))
        # Each image's home is its first worker in the rendezvous order of its hashes
        # (the names carry random ports, so the homes differ from run to run).
        names = [m.name for m in fleet.roster.of("prefill")]
        for seed in range(10, 18):
            hashes = list(image(seed, "x").mm_inputs.mm_hashes)
            homes = {i for i, p in enumerate(ps) for r in p.requests
                     if list(r.mm_inputs.mm_hashes) == hashes}  # fmt: skip
            assert homes == {rendezvous_order(",".join(hashes), names)[0]}
        # No decode leg carried pixels: each was stripped for a language-model-only decode.
        assert not any(r.mm_inputs.HasField("pixel_values") for d in ds for r in d.requests)

    run(test, bytes_router=bytes_router)


async def served_bytes(fleet: FleetPd, request: pb.GenerateRequest) -> list[bytes]:
    return [r async for r in fleet.generate(request.SerializeToString())]


def test_a_failure_before_the_first_response_is_retried_on_another_decode() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        ds[0].fail_next = [grpc.StatusCode.UNAVAILABLE]
        got = await served(fleet, image(1, "retried"))
        assert got[-1].HasField("complete")
        assert [len(d.requests) for d in ds] == [1, 1]
        assert sum(len(p.requests) for p in ps) == 2  # planned again from the prefill on
        # Both failing: the client gets the last failure, after two attempts.
        for d in ds:
            d.fail_next = [grpc.StatusCode.UNAVAILABLE]
        with pytest.raises(WorkerFailedToStart) as caught:
            await served(fleet, image(1, "both"))
        assert caught.value.status == 503 and caught.value.code == "decode_worker_failed_to_start"
        # Two failures in a row eject the first decode (passively: no probe ran).
        assert fleet.roster.of("decode")[0].health.health is Health.EJECTED

    run(test)


def test_no_retry_for_a_workers_400_nor_after_the_first_response() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        for d in ds:
            d.fail_next = [grpc.StatusCode.INVALID_ARGUMENT]
        with pytest.raises(PolicyError) as caught:
            await served(fleet, image(1, "bad"))
        assert caught.value.status == 400 and sum(len(d.requests) for d in ds) == 1
        for d in ds:
            d.fail_next, d.cut_after_first = [], True
        seen: list[pb.GenerateResponse] = []

        async def cut() -> None:
            async for response in fleet.generate(image(1, "cut")):
                seen.append(response)

        with pytest.raises(PolicyError) as caught:
            await cut()
        assert len(seen) == 1 and caught.value.code == "decode_stream_error"
        assert sum(len(d.requests) for d in ds) == 2  # the cut stream was not tried again

    run(test)


def test_a_probe_ejects_a_sick_decode_and_readmits_it_as_what_it_came_back_as() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        sick = fleet.roster.of("decode")[0]
        ds[0].healthy = False
        await fleet.probe_once()
        assert sick.health.health is Health.EJECTED
        for i in range(3):
            await served(fleet, image(i, f"around-{i}"))
        assert len(ds[0].requests) == 0 and len(ds[1].requests) == 3
        # It comes back with its vision tower: re-read, and an M-RoPE image may go to it.
        ds[0].healthy, ds[0].supports_vision = True, True
        await fleet.probe_once()
        assert health(sick) is Health.EJECTED  # its backoff has not run out
        now[0] += 60
        await fleet.probe_once()
        assert health(sick) is Health.HEALTHY
        assert not sick.worker.capability.language_model_only
        mrope = to_proto(mrope_request())
        await served(fleet, mrope)
        # The only one that can: its leg keeps the grid.
        assert "image_grid_thw" in ds[0].requests[-1].mm_inputs.model_specific_tensors

    run(test)


def test_compatible_first_then_every_compatible_decode_down_is_a_retryable_503() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        # Only language-model-only decodes that take no metadata: the M-RoPE image is the
        # policy's 400, never a 503, and no worker is called.
        with pytest.raises(MropeOnLanguageModelOnlyDecode):
            await served(fleet, to_proto(mrope_request()))
        assert not any(p.requests for p in ps)
        for d in ds:
            d.healthy = False
        await fleet.probe_once()
        with pytest.raises(NoWorkerAvailable) as caught:
            await served(fleet, to_proto(text_request()))
        assert caught.value.status == 503 and caught.value.retryable
        assert caught.value.code == "no_decode_worker_available"

    run(test)


def test_a_prefill_must_come_with_its_handoff() -> None:
    async def main() -> None:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
        worker = GrpcWorker("127.0.0.1:1", channel, WorkerCapability(Support.TRUE))
        with pytest.raises(PolicyError) as caught:
            FleetPd().add("prefill", worker)
        assert caught.value.code == "pd_invalid_configuration"
        await channel.close()

    asyncio.run(main())


def test_the_fleet_example_of_the_docs_runs_verbatim() -> None:
    route_fleet = load_route("route_fleet")

    async def main() -> None:
        ps, ds = [PrefillEngine(), PrefillEngine()], [Decode(), Decode()]
        async with AsyncExitStack() as stack:
            p = [await stack.enter_async_context(serve_address(e)) for e in ps]
            d = [await stack.enter_async_context(serve_address(e)) for e in ds]
            tokens: Any = await route_fleet(image(1, "docs"), p, d)
        (leg,) = [r for e in ds for r in e.requests]
        assert tokens == answer(leg) and not leg.mm_inputs.HasField("pixel_values")

    asyncio.run(main())


def test_with_no_other_worker_to_try_the_caller_gets_the_failure_that_made_it_try() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        ds[0].fail_next = [grpc.StatusCode.UNAVAILABLE]
        with pytest.raises(WorkerFailedToStart) as caught:  # not a 503 for no decode left
            await served(fleet, image(1, "alone"))
        assert caught.value.code == "decode_worker_failed_to_start"
        assert len(ds[0].requests) == 1

    run(test, decodes=1)


def test_a_pair_whose_member_left_or_was_described_anew_is_retired() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        for i in range(6):
            await served(fleet, image(i, f"r{i}"))
        pairs = set(fleet._pairs)
        assert pairs and all(fleet.roster.named(n) for key in pairs for n in key)
        gone = fleet.roster.of("decode")[0]
        fleet.roster.remove(gone)
        kept = fleet.roster.of("decode")[0]
        fleet.roster.redescribe(kept, attrs.evolve(kept.worker))  # described anew
        await served(fleet, image(99, "after"))
        # Only the pair just used is left: the others named a member that left, or the
        # worker the member was before it was described again.
        assert len(fleet._pairs) == 1
        ((p, d),) = fleet._pairs
        assert d == kept.name and fleet._pairs[(p, d)][1] is kept.worker

    run(test)


def test_a_member_that_left_takes_its_pairs_with_it_however_the_fleet_churns() -> None:
    # Traffic that reuses a pair builds no new one: the pairs of members gone must go
    # anyway, or a fleet whose workers come and go holds a router (and its channels'
    # state) per worker it ever had.
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        kept = fleet.roster.of("decode")[0]
        for i in range(40):
            joined = fleet.add("decode", attrs.evolve(kept.worker, address=f"churn-{i}"))
            # At once, so that the least-loaded choice spreads them to the one joined too.
            await asyncio.gather(*(served(fleet, image(j, f"c{i}-{j}")) for j in range(6)))
            assert any(joined.name in key for key in fleet._pairs)
            fleet.roster.remove(joined)
            await served(fleet, image(0, f"after-{i}"))
            live = {m.name for m in fleet.roster}
            assert all(n in live for key in fleet._pairs for n in key)
        assert len(fleet._pairs) <= len(fleet.roster.of("prefill")) * len(fleet.roster.of("decode"))
        await asyncio.sleep(0)
        assert not fleet._closing  # each retired pair was closed

    run(test)


def test_n_samples_decode_alone_with_no_prefill_leg() -> None:
    async def test(fleet: FleetPd, ps: list[PrefillEngine], ds: list[Decode], now: Clock) -> None:
        answers = await served(fleet, to_proto(text_request(n=2, request_id="two")))
        assert answers and not any(p.requests for p in ps)  # each sample decodes alone
        assert sum(len(d.requests) for d in ds) == 1

    run(test)

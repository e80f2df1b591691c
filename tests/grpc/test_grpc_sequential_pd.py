"""The seed's scenarios end to end: SequentialPd against engines over real gRPC on loopback."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack

import pytest
from engines import (
    Engine,
    FullVisionDecodeEngine,
    LanguageModelOnlyDecodeEngine,
    PrefillEngine,
    answer,
    serve,
)
from proto_strategies import to_proto

import pd_policy
import routers
from pd_policy import (
    DecodeCandidate,
    MediaRefsOnLanguageModelOnlyDecode,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    PolicyError,
    VisionSupport,
    WorkerFailedToStart,
)
from pd_policy.tools.scenarios import image_request, media_ref_request, mrope_request, text_request
from pd_policy_grpc import SequentialPd, capability_from_info
from pd_policy_grpc.wire import pb, pb_grpc
from routers import sequential_pd

Scenario = Callable[[SequentialPd, PrefillEngine, Engine], Awaitable[None]]


@pytest.fixture(autouse=True, params=routers.MODES)
def router_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test here runs against the router on messages and on bytes."""
    with routers.mode(request.param):
        yield


def run(
    scenario: Scenario,
    *,
    decode: Engine | None = None,
    prefill: PrefillEngine | None = None,
    worker: pd_policy.WorkerCapability | None = None,
) -> None:
    async def main() -> None:
        p = prefill or PrefillEngine()
        d = decode or LanguageModelOnlyDecodeEngine()
        async with AsyncExitStack() as stack:
            p_channel = await stack.enter_async_context(serve(p))
            d_channel = await stack.enter_async_context(serve(d))
            # The capability comes from the decode worker's own GetModelInfo, over the wire.
            info = await pb_grpc.VllmEngineStub(d_channel).GetModelInfo(pb.GetModelInfoRequest())
            capability = worker or capability_from_info(info)
            pd = sequential_pd(p_channel, d_channel, capability, timeout=10)
            await scenario(pd, p, d)

    asyncio.run(main())


async def collect(pd: SequentialPd, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [r async for r in pd.generate(request)]


def test_gridless_image_on_a_language_model_only_decode_succeeds() -> None:
    request = to_proto(image_request(cache_salt=None))

    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        responses = await collect(pd, request)
        # Prefill got the whole request, pixels included, sanitised and tagged for NIXL.
        (prefill_leg,) = p.requests
        assert prefill_leg.mm_inputs.pixel_values == request.mm_inputs.pixel_values
        assert prefill_leg.sampling_params.max_tokens == 1
        assert json.loads(prefill_leg.kv_transfer_params_json)["do_remote_decode"] is True
        # Decode saw ids, hashes and the relayed KV parameters only.
        (leg,) = d.requests
        assert list(leg.tokenized.input_ids) == list(request.tokenized.input_ids)
        assert list(leg.mm_inputs.mm_hashes) == list(request.mm_inputs.mm_hashes)
        assert leg.mm_inputs == pb.MultimodalInputs(
            mm_hashes=request.mm_inputs.mm_hashes, modality=request.mm_inputs.modality
        )
        assert not leg.HasField("media_refs")
        # Both legs ran under the router's own id, and the decode read the prefill's KV.
        assert leg.request_id == prefill_leg.request_id != request.request_id
        assert json.loads(leg.kv_transfer_params_json)["transfer_id"] == f"xfer-{leg.request_id}"
        assert responses[-1].complete.output_ids == answer(leg)
        assert d.aborted == [] and p.aborted == []

    run(scenario)


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (mrope_request(), MropeOnLanguageModelOnlyDecode),
        (media_ref_request(), MediaRefsOnLanguageModelOnlyDecode),
        (image_request(n=2), NSamplesOnLanguageModelOnlyDecode),
    ],
)
def test_carve_outs_fail_with_their_400_before_any_request(
    request_: pd_policy.Request, error: type[PolicyError]
) -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        with pytest.raises(error) as exc:
            await collect(pd, to_proto(request_))
        assert exc.value.status == 400
        assert not exc.value.retryable
        assert d.requests == []
        assert p.requests == []

    run(scenario)


def test_no_kv_from_prefill_is_a_502_for_an_image_but_not_for_text() -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        with pytest.raises(MissingKvTransferParams) as exc:
            await collect(pd, to_proto(image_request()))
        assert exc.value.status == 502
        assert d.requests == []
        # The prefill completed (nothing to abort) and decode was never sent.
        assert p.aborted == [] and d.aborted == []
        text = to_proto(text_request(request_id="txt"))
        responses = await collect(pd, text)
        (leg,) = d.requests
        assert not leg.HasField("kv_transfer_params_json")  # decode recomputes the text
        assert responses[-1].complete.output_ids == answer(leg)

    run(scenario, prefill=PrefillEngine(returns="nothing"))


def test_the_legacy_typed_kv_field_is_relayed() -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        # A text request: under NIXL the host and port alone are no handoff for an image.
        await collect(pd, to_proto(text_request()))
        (leg,) = d.requests
        assert leg.kv_transfer_params.remote_host == "prefill-0.local"
        assert leg.kv_transfer_params.remote_port == 7000

    run(scenario, prefill=PrefillEngine(returns="legacy"))


def test_the_legacy_pair_alone_is_no_nixl_handoff_for_an_image() -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        with pytest.raises(MissingKvTransferParams) as caught:
            await collect(pd, to_proto(image_request()))
        assert "remote_block_ids" in caught.value.message
        assert "prefill-0.local" not in caught.value.message
        assert not d.requests  # refused before decode is called

    run(scenario, prefill=PrefillEngine(returns="legacy"))


def test_a_full_vision_decode_keeps_todays_forms() -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        await collect(pd, to_proto(mrope_request()))  # identity-only: grids ride along
        leg = d.requests[-1]
        assert "image_grid_thw" in leg.mm_inputs.model_specific_tensors
        assert not leg.mm_inputs.HasField("pixel_values")
        assert leg.mm_inputs.mm_placeholders
        assert leg.kv_transfer_params_json
        await collect(pd, to_proto(image_request(n=2, request_id="n2")))  # full: pixels too
        leg = d.requests[-1]
        assert leg.mm_inputs.HasField("pixel_values")
        assert not leg.HasField("kv_transfer_params_json")  # n>1: nothing is relayed

    run(scenario, decode=FullVisionDecodeEngine())


def test_without_the_policy_the_engine_fails_deep() -> None:
    # The bug the policy fixes: an identity leg sent to a language-model-only worker.
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        with pytest.raises(WorkerFailedToStart) as exc:
            await collect(pd, to_proto(image_request()))
        assert exc.value.code == "decode_worker_failed_to_start"
        assert exc.value.status == 400
        assert "encoder cache size 0" in exc.value.message
        # Aborted under the id it ran under; the prefill had completed.
        assert d.aborted == [d.requests[0].request_id] and p.aborted == []

    run(scenario, worker=pd_policy.WorkerCapability())  # an old servicer: unknown


def test_a_prefill_failure_names_its_leg() -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        with pytest.raises(WorkerFailedToStart) as exc:
            await collect(pd, to_proto(image_request()))
        assert (exc.value.code, exc.value.status) == ("prefill_worker_failed_to_start", 429)
        assert exc.value.retryable
        assert d.requests == []

    run(scenario, prefill=PrefillEngine(returns="RESOURCE_EXHAUSTED"))


def test_cancelling_mid_stream_aborts_the_decode_leg_at_once() -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        d.hold.set()
        first = asyncio.Event()

        async def consume() -> None:
            async for _ in pd.generate(to_proto(image_request())):
                first.set()

        task = asyncio.create_task(consume())
        await first.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Decode had answered, so its handoff was over; the prefill had completed.
        assert d.aborted == [d.requests[0].request_id] and p.aborted == []

    run(scenario)


def test_stopping_iteration_early_aborts_the_decode_leg() -> None:
    async def scenario(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        stream = pd.generate(to_proto(image_request()))
        assert isinstance(stream, AsyncGenerator)
        await anext(stream)
        await stream.aclose()
        assert d.aborted == [d.requests[0].request_id] and p.aborted == []

    run(scenario)


def test_several_decode_candidates_prefer_one_that_can_serve() -> None:
    async def main() -> None:
        p, lm_only, vision = (
            PrefillEngine(),
            LanguageModelOnlyDecodeEngine(),
            FullVisionDecodeEngine(),
        )
        async with AsyncExitStack() as stack:
            p_channel = await stack.enter_async_context(serve(p))
            lm_channel = await stack.enter_async_context(serve(lm_only))
            vision_channel = await stack.enter_async_context(serve(vision))
            candidates = [
                DecodeCandidate(pd_policy.WorkerCapability(VisionSupport.FALSE), lm_channel),
                DecodeCandidate(pd_policy.WorkerCapability(VisionSupport.TRUE), vision_channel),
            ]
            pd = sequential_pd(p_channel, candidates, timeout=10)
            await collect(pd, to_proto(image_request()))  # the first candidate can serve it
            assert len(lm_only.requests) == 1 and vision.requests == []
            await collect(pd, to_proto(mrope_request(request_id="qwen")))  # only vision can
            assert len(lm_only.requests) == 1 and len(vision.requests) == 1
            lm_only_pool = sequential_pd(p_channel, candidates[:1], timeout=10)
            with pytest.raises(MropeOnLanguageModelOnlyDecode):
                await collect(lm_only_pool, to_proto(mrope_request(request_id="no")))
            with pytest.raises(TypeError):
                sequential_pd(p_channel, lm_channel)

    asyncio.run(main())

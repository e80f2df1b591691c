"""``SequentialPd`` under every handoff contract, and n>1 without a prefill leg."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
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

import routers
from pd_policy import (
    InvalidConfiguration,
    KvConnectorMode,
    NSamplesOnLanguageModelOnlyDecode,
    PrefillKv,
    VisionSupport,
    WorkerCapability,
)
from pd_policy.tools.scenarios import image_request, text_request
from pd_policy_grpc import SequentialPd
from pd_policy_grpc.wire import pb
from routers import sequential_pd

Body = Callable[[SequentialPd, PrefillEngine, Engine], Awaitable[None]]
MOONCAKE = PrefillKv(KvConnectorMode.MOONCAKE, engine_id="p0", bootstrap_host="10.0.0.1")


@pytest.fixture(autouse=True, params=routers.MODES)
def router_mode(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test here runs against the router on messages and on bytes."""
    with routers.mode(request.param):
        yield


def run(body: Body, *, kv: PrefillKv, prefill: PrefillEngine, decode: Engine) -> None:
    async def main() -> None:
        async with AsyncExitStack() as stack:
            p_channel = await stack.enter_async_context(serve(prefill))
            d_channel = await stack.enter_async_context(serve(decode))
            worker = WorkerCapability(VisionSupport.from_bool(decode.supports_vision))
            pd = sequential_pd(p_channel, d_channel, worker, kv=kv, timeout=10)
            await body(pd, prefill, decode)

    asyncio.run(main())


async def collect(pd: SequentialPd, request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
    return [r async for r in pd.generate(request)]


def test_mooncake_mints_a_transfer_that_both_legs_name() -> None:
    async def body(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        responses = await collect(pd, to_proto(image_request()))
        (prefill_leg,), (decode_leg,) = p.requests, d.requests
        tagged = json.loads(prefill_leg.kv_transfer_params_json)
        minted = json.loads(decode_leg.kv_transfer_params_json)
        assert tagged["transfer_id"] == minted["transfer_id"]
        assert tagged["transfer_id"].startswith("xfer-")
        assert minted["remote_engine_id"] == "p0"
        assert minted["remote_bootstrap_addr"] == "http://10.0.0.1:8998"
        # The prefill returned nothing, and that is fine: the minted transfer is the handoff.
        assert responses[-1].complete.output_ids == answer(decode_leg)
        await collect(pd, to_proto(image_request(request_id="again")))
        assert (
            json.loads(d.requests[-1].kv_transfer_params_json)["transfer_id"]
            != minted["transfer_id"]
        )

    run(body, kv=MOONCAKE, prefill=PrefillEngine(returns="nothing"),
        decode=LanguageModelOnlyDecodeEngine())  # fmt: skip


def test_legacy_mooncake_sends_host_and_port_to_every_decode_leg() -> None:
    legacy = PrefillKv(KvConnectorMode.MOONCAKE, bootstrap_host="10.0.0.1", bootstrap_port=7000)

    async def body(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        await collect(pd, to_proto(image_request()))
        await collect(pd, to_proto(text_request(n=2, request_id="n2")))
        for leg in d.requests:
            typed = leg.kv_transfer_params
            assert (typed.remote_host, typed.remote_port) == ("10.0.0.1", 7000)
        assert not p.requests[0].HasField("kv_transfer_params_json")
        assert len(p.requests) == 1  # n=2 ran no prefill

    run(body, kv=legacy, prefill=PrefillEngine(returns="nothing"),
        decode=LanguageModelOnlyDecodeEngine())  # fmt: skip


def test_n_samples_run_decode_alone() -> None:
    async def body(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        await collect(pd, to_proto(image_request(n=2)))
        await collect(pd, to_proto(text_request(n=3, request_id="t")))
        assert p.requests == []
        full, text = d.requests
        assert full.mm_inputs.HasField("pixel_values")  # FULL: decode recomputes the image
        assert not full.HasField("kv_transfer_params_json")
        assert full.sampling_params.n == 2 and text.sampling_params.n == 3

    run(body, kv=PrefillKv(KvConnectorMode.NIXL), prefill=PrefillEngine(),
        decode=FullVisionDecodeEngine())  # fmt: skip


def test_n_samples_with_an_image_stay_refused_on_a_language_model_only_worker() -> None:
    async def body(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        with pytest.raises(NSamplesOnLanguageModelOnlyDecode):
            await collect(pd, to_proto(image_request(n=2)))
        await collect(pd, to_proto(text_request(n=2)))  # text recomputes on decode
        assert p.requests == [] and len(d.requests) == 1

    run(body, kv=PrefillKv(KvConnectorMode.NIXL), prefill=PrefillEngine(),
        decode=LanguageModelOnlyDecodeEngine())  # fmt: skip


def test_passthrough_relays_what_the_engine_returns(caplog: pytest.LogCaptureFixture) -> None:
    async def body(pd: SequentialPd, p: PrefillEngine, d: Engine) -> None:
        await collect(pd, to_proto(image_request()))
        assert not p.requests[0].HasField("kv_transfer_params_json")  # not tagged
        (leg,) = d.requests
        assert json.loads(leg.kv_transfer_params_json)["transfer_id"] == f"xfer-{leg.request_id}"

    with caplog.at_level(logging.WARNING, logger="pd_policy_grpc.client"):
        run(body, kv=PrefillKv(KvConnectorMode.PASSTHROUGH), prefill=PrefillEngine(),
            decode=LanguageModelOnlyDecodeEngine())  # fmt: skip
    assert "passthrough" in caplog.text  # a language-model-only pool is told what to expect


def test_mooncake_needs_a_bootstrap_host() -> None:
    with pytest.raises(InvalidConfiguration) as caught:
        sequential_pd(None, None, WorkerCapability(), kv=KvConnectorMode.MOONCAKE)
    assert caught.value.param == "bootstrap_host"

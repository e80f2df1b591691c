"""``pd_policy_grpc`` against SMG's real vLLM servicer on the tiny Qwen2-VL (M-RoPE).

Three servicer processes, started once for this module and stopped by process
id: a full-vision prefill (KV producer), a ``--language-model-only`` decode (KV
consumer) and a full-vision baseline with no connector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from qwen_prompts import _WORDS, prompt
from router_side import frames, image, router_request, router_video_request
from servers import running
from smg_peers import Streamed, servicer, streamed
from tiny_models import TinyModel

import grpc
import routers
from pd_policy import KvConnectorMode, PrefillKv, VisionSupport, plan_kv_handoff
from pd_policy_grpc import (
    SequentialPd,
    build_decode_leg,
    capability_from_info,
    clone_without_mm,
    metadata_only,
    prefill_kv_from_info,
    prefill_leg,
    relay_kv,
)
from pd_policy_grpc.wire import pb, pb_grpc
from routers import sequential_pd

_LIMITS = {"image": 1, "video": 1}


@attrs.frozen
class Fleet:
    prefill: str
    decode: str
    baseline: str
    model: TinyModel
    decode_log: Path


@pytest.fixture(scope="module")
def fleet(qwen2vl: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("smg-qwen2vl")
    transfers = root / "transfers"
    prefill = servicer(
        "qwen-prefill", qwen2vl, root, limits=_LIMITS,
        kv_role="kv_producer", transfer_dir=transfers,
    )  # fmt: skip
    decode = servicer(
        "qwen-decode", qwen2vl, root, language_model_only=True,
        kv_role="kv_consumer", transfer_dir=transfers,
    )  # fmt: skip
    baseline = servicer("qwen-baseline", qwen2vl, root, limits=_LIMITS)
    with running([prefill, decode, baseline]):
        yield Fleet(prefill.address, decode.address, baseline.address, qwen2vl, decode.log)


def request(
    fleet: Fleet,
    variant: str,
    seed: int,
    *,
    keep_grids_on_cpu: bool = True,
    logprobs: int | None = None,
) -> pb.GenerateRequest:
    """A Qwen2-VL request: a 112x112 image (16 placeholder ids, grid (1, 8, 8)) first."""
    return router_request(
        str(fleet.model.path),
        prompt(variant),
        [image(seed, side=112)],
        image_token_id=fleet.model.image_token_id,
        request_id=f"{variant}-{seed}",
        keep_grids_on_cpu=keep_grids_on_cpu,
        logprobs=logprobs,
    )


async def generate(address: str, message: pb.GenerateRequest) -> Streamed:
    async with grpc.aio.insecure_channel(address) as channel:
        return await streamed(pb_grpc.VllmEngineStub(channel).Generate(message, timeout=60))


async def serving(address: str) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def test_the_capability_agrees_with_the_servicer(fleet: Fleet) -> None:
    async def main() -> None:
        for address, vision in ((fleet.prefill, True), (fleet.decode, False),
                                (fleet.baseline, True)):  # fmt: skip
            async with grpc.aio.insecure_channel(address) as channel:
                stub = pb_grpc.VllmEngineStub(channel)
                model_info = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
                server_info = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
            assert model_info.supports_vision is vision
            capability = capability_from_info(model_info, server_info)
            assert capability.supports_vision is VisionSupport.from_bool(vision)

    asyncio.run(main())


def test_a_repeated_image_on_a_full_vision_prefill_leaves_the_engine_alive(fleet: Fleet) -> None:
    # A router that leaves image_grid_thw out of keep_on_cpu_keys: its second request with the
    # same image hits the prefix cache over the image, where vLLM 0.32 keeps only keep-on-CPU
    # fields, and killed the engine (KeyError: 'image_grid_thw') before the prefill leg
    # listed every grid itself.
    handoff = plan_kv_handoff(PrefillKv(KvConnectorMode.PASSTHROUGH), n=1)

    async def main() -> None:
        careless = request(fleet, "repeat", 5, keep_grids_on_cpu=False)
        assert "image_grid_thw" not in careless.mm_inputs.keep_on_cpu_keys
        leg = prefill_leg(careless, handoff)
        assert "image_grid_thw" in leg.mm_inputs.keep_on_cpu_keys
        first = await generate(fleet.baseline, leg)
        second = await generate(fleet.baseline, leg)
        assert second.complete.cached_tokens > 0  # the image lay in the cached prefix
        assert first.tokens == second.tokens
        assert await serving(fleet.baseline)
        assert (await generate(fleet.baseline, request(fleet, "after", 6))).tokens

    asyncio.run(main())


async def sequential(fleet: Fleet) -> SequentialPd:
    """A ``SequentialPd`` configured from the workers' own answers."""
    p = grpc.aio.insecure_channel(fleet.prefill)
    d = grpc.aio.insecure_channel(fleet.decode)
    decode_stub, prefill_stub = pb_grpc.VllmEngineStub(d), pb_grpc.VllmEngineStub(p)
    decode_info = await decode_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    decode_server = await decode_stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    prefill_server = await prefill_stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
    capability = capability_from_info(decode_info, decode_server)
    kv = prefill_kv_from_info(prefill_server, fleet.prefill)
    return sequential_pd(p, d, capability, kv=kv, timeout=60)


@pytest.mark.parametrize("mode", routers.MODES)
def test_images_a_b_a_on_a_language_model_only_decode_that_takes_metadata(
    fleet: Fleet, mode: str
) -> None:
    # Both routers, on messages and on bytes, each with its own prompt (a fresh cache).
    variant = f"meta-{mode}"

    async def main() -> None:
        expected = [
            await generate(fleet.baseline, request(fleet, variant, seed, logprobs=0))
            for seed in (1, 2)
        ]
        # The images give other answers (the tiny model's greedy tokens may tie; its
        # log-probabilities do not), else matching them would prove nothing.
        assert expected[0].logprobs != pytest.approx(expected[1].logprobs, abs=1e-4)
        with routers.mode(mode):
            pd = await sequential(fleet)
        (candidate,) = pd.candidates
        # Inferred from the servicer's own answers: supports_vision false, a KV consumer,
        # and an encoder budget vLLM gives only to embedding-only modalities.
        assert candidate.worker.takes_mm_metadata
        served = [
            await streamed(pd.generate(request(fleet, variant, seed, logprobs=0)))
            for seed in (1, 2, 1)
        ]
        for got, want in zip(served, [expected[0], expected[1], expected[0]], strict=True):
            assert got.tokens == want.tokens
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        first, b, again = (s.kv_report for s in served)
        assert (first["local_cached_tokens"], b["local_cached_tokens"]) == (0, 0)
        assert again["local_cached_tokens"] > 0
        assert first["loaded_tokens"] > 0 and b["loaded_tokens"] > 0

    asyncio.run(main())


def test_a_metadata_leg_without_kv_is_refused_and_the_servicer_survives(fleet: Fleet) -> None:
    async def main() -> None:
        leg = metadata_only(request(fleet, "bare", 3))
        assert not leg.HasField("kv_transfer_params_json")
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await generate(fleet.decode, leg)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert await serving(fleet.decode)
        pd = await sequential(fleet)
        served = await streamed(pd.generate(request(fleet, "after-bare", 3)))
        assert (
            served.tokens
            == (await generate(fleet.baseline, request(fleet, "after-bare", 3))).tokens
        )

    asyncio.run(main())


def test_a_hashes_only_leg_gets_text_positions(fleet: Fleet) -> None:
    # What the metadata form exists to avoid: without the grid the servicer salts the leg by
    # its hashes and decodes with text positions; the answer drifts without an error.
    async def main() -> None:
        original = request(fleet, "hashes-only", 4, logprobs=0)
        handoff = plan_kv_handoff(PrefillKv(KvConnectorMode.TRANSFER), n=1)
        async with grpc.aio.insecure_channel(fleet.prefill) as channel:
            stub = pb_grpc.VllmEngineStub(channel)
            complete = (await streamed(stub.Generate(prefill_leg(original, handoff)))).complete
        leg = relay_kv(clone_without_mm(original), complete)
        stripped = await generate(fleet.decode, leg)
        want = await generate(fleet.baseline, request(fleet, "hashes-only", 4, logprobs=0))
        assert stripped.logprobs != pytest.approx(want.logprobs, abs=1e-4)
        log = fleet.decode_log.read_text(errors="replace")
        assert "decode-side positions will be text-only" in log

    asyncio.run(main())


def video_request(fleet: Fleet, variant: str, seed: int) -> pb.GenerateRequest:
    """A Qwen2-VL request with one clip of four 56x56 frames: grid (2, 24, 24), 288 ids."""
    words = " ".join([variant, *(_WORDS[(i * 7) % len(_WORDS)] for i in range(40))])
    text = f"<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|> {words}<|im_end|>\n"
    return router_video_request(
        str(fleet.model.path), text + "<|im_start|>assistant\n", frames(seed),
        request_id=f"{variant}-{seed}",
    )  # fmt: skip


@pytest.mark.parametrize("mode", routers.MODES)
def test_clips_a_b_a_on_a_language_model_only_decode_that_takes_metadata(
    fleet: Fleet, mode: str
) -> None:
    # A video batch takes the metadata path as an image's does: its grid (video_grid_thw),
    # hash and placeholder, and no frame, on a decode worker with no vision tower.
    variant = f"video-{mode}"
    # The text follows the clip, so each mode needs clips of its own: a clip another mode
    # sent is rightly served from the decode's cache.
    a, b = (2 * routers.MODES.index(mode) + s for s in (1, 2))

    async def main() -> None:
        clips = {s: video_request(fleet, variant, s) for s in (a, b)}
        expected = [await generate(fleet.baseline, clips[s]) for s in (a, b)]
        assert expected[0].logprobs != pytest.approx(expected[1].logprobs, abs=1e-4)
        with routers.mode(mode):
            pd = await sequential(fleet)
        (candidate,) = pd.candidates
        form, leg = build_decode_leg(clips[a], candidate.worker)
        assert form.value == "mrope_metadata" and not leg.mm_inputs.HasField("pixel_values")
        assert "video_grid_thw" in leg.mm_inputs.keep_on_cpu_keys
        served = [await streamed(pd.generate(clips[s])) for s in (a, b, a)]
        for got, want in zip(served, [expected[0], expected[1], expected[0]], strict=True):
            assert got.tokens == want.tokens
            assert got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        assert served[2].kv_report["local_cached_tokens"] > 0  # clip 1 again: its own blocks
        assert served[1].kv_report["local_cached_tokens"] == 0  # clip 2 shares none of them

    asyncio.run(main())

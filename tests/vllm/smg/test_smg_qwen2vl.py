"""``pd_policy_grpc`` against SMG's real vLLM servicer on the tiny Qwen2-VL (M-RoPE).

Three servicer processes, started once for this module and stopped by process
id: a full-vision prefill (KV producer), a ``--language-model-only`` decode (KV
consumer) and a full-vision baseline with no connector.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import attrs
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from router_side import image, router_request
from servers import running
from smg_peers import Streamed, servicer, streamed
from tiny_models import TinyModel

import grpc
from pd_policy import KvConnectorMode, PrefillKv, VisionSupport, plan_kv_handoff
from pd_policy_grpc import capability_from_info, prefill_leg
from pd_policy_grpc.wire import pb, pb_grpc

_FILLER = " ".join(["describe the red dog on the mat and the blue cat"] * 4)
_LIMITS = {"image": 1, "video": 0}


@attrs.frozen
class Fleet:
    prefill: str
    decode: str
    baseline: str
    model: TinyModel


@pytest.fixture(scope="module")
def fleet(qwen2vl: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("smg-qwen2vl")
    transfers = root / "transfers"
    prefill, prefill_at = servicer(
        "qwen-prefill", qwen2vl, root, limits=_LIMITS,
        kv_role="kv_producer", transfer_dir=transfers,
    )  # fmt: skip
    decode, decode_at = servicer(
        "qwen-decode", qwen2vl, root, language_model_only=True,
        kv_role="kv_consumer", transfer_dir=transfers,
    )  # fmt: skip
    baseline, baseline_at = servicer("qwen-baseline", qwen2vl, root, limits=_LIMITS)
    with running([prefill, decode, baseline]):
        yield Fleet(prefill_at, decode_at, baseline_at, qwen2vl)


def request(
    fleet: Fleet, variant: str, seed: int, *, keep_grids_on_cpu: bool = True
) -> pb.GenerateRequest:
    """A Qwen2-VL request: a 112x112 image (16 placeholder ids, grid (1, 8, 8)) first."""
    prompt = (
        f"<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>{variant} {_FILLER}"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    return router_request(
        str(fleet.model.path),
        prompt,
        [image(seed, side=112)],
        image_token_id=fleet.model.image_token_id,
        request_id=f"{variant}-{seed}",
        keep_grids_on_cpu=keep_grids_on_cpu,
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

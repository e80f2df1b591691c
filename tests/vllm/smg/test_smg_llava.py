"""``pd_policy_grpc`` against SMG's real vLLM servicer: grid-less LLaVA, vision prefill to a
``--language-model-only`` decode, joined by the ``TransferConnector``.

Four servicer processes, started once for this module and stopped by process
id: a full-vision prefill (KV producer), two language-model-only decodes (KV
consumers; the fleet test kills the second and restarts it) and a full-vision
baseline with no connector.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from live_engines import BLOCK_SIZE
from llava_prompts import TEXT
from router_side import image, router_request
from servers import running, stop_all
from smg_peers import Recorder, Streamed, servicer, streamed
from tiny_models import TinyModel

import grpc
import routers
from docs_examples import load_route
from pd_policy import (
    Health,
    KvConnectorMode,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    PayloadLocation,
    PolicyError,
    Roster,
    VisionSupport,
    routable,
)
from pd_policy.tools.scenarios import mrope_request
from pd_policy_grpc import SequentialPd, capability_from_info, prefill_kv_from_info
from pd_policy_grpc.fleet import FleetPd, describe_worker
from pd_policy_grpc.wire import pb, pb_grpc
from routers import sequential_pd
from wire_messages import to_proto


@attrs.frozen
class Fleet:
    prefill: str
    decode: str
    baseline: str
    model: TinyModel
    #: A second language-model-only decode, which the fleet test kills and restarts.
    second: str = ""
    second_server: Any = None
    root: Path | None = None


@pytest.fixture(scope="module")
def fleet(llava: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("smg-llava")
    transfers = root / "transfers"
    prefill = servicer("llava-prefill", llava, root, kv_role="kv_producer", transfer_dir=transfers)
    decode = servicer(
        "llava-decode", llava, root, language_model_only=True,
        kv_role="kv_consumer", transfer_dir=transfers,
    )  # fmt: skip
    baseline = servicer("llava-baseline", llava, root)
    second = servicer(
        "llava-decode-2", llava, root, language_model_only=True,
        kv_role="kv_consumer", transfer_dir=transfers,
    )  # fmt: skip
    with running([prefill, decode, baseline, second]):
        yield Fleet(prefill.address, decode.address, baseline.address, llava, second.address,
                    second, root)  # fmt: skip


def request(
    fleet: Fleet, variant: str, seed: int | None, *, n: int = 1, rid: str | None = None
) -> pb.GenerateRequest:
    """A LLaVA request over four 32-id blocks; ``seed`` picks the image (``None``: text)."""
    if seed is None:
        prompt = f"USER: {variant} {TEXT}\nASSISTANT:"
        return router_request(str(fleet.model.path), prompt, request_id=variant, n=n)
    return router_request(
        str(fleet.model.path),
        f"USER: <image>\n{variant} {TEXT}\nASSISTANT:",
        [image(seed)],
        image_token_id=fleet.model.image_token_id,
        request_id=rid or f"{variant}-{seed}",
        n=n,
    )


async def baseline(fleet: Fleet, message: pb.GenerateRequest) -> Streamed:
    async with grpc.aio.insecure_channel(fleet.baseline) as channel:
        return await streamed(pb_grpc.VllmEngineStub(channel).Generate(message, timeout=60))


async def info(address: str) -> tuple[pb.GetModelInfoResponse, pb.GetServerInfoResponse]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.VllmEngineStub(channel)
        return (
            await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10),
            await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10),
        )


def test_the_capability_agrees_with_the_servicer(fleet: Fleet) -> None:
    async def main() -> None:
        for address, vision in ((fleet.prefill, True), (fleet.decode, False),
                                (fleet.baseline, True)):  # fmt: skip
            model_info, server_info = await info(address)
            assert model_info.supports_vision is vision
            capability = capability_from_info(model_info, server_info)
            assert capability.supports_vision is VisionSupport.from_bool(vision)
        # The project's own connector is read as what it is: tag the prefill, relay.
        _, prefill_info = await info(fleet.prefill)
        assert prefill_info.kv_connector == "TransferConnector"
        assert prefill_kv_from_info(prefill_info, fleet.prefill).mode is KvConnectorMode.TRANSFER

    asyncio.run(main())


async def sequential(
    fleet: Fleet, kv: KvConnectorMode | None = None, labels: dict[str, str] | None = None
) -> tuple[SequentialPd, Recorder, Recorder]:
    """A ``SequentialPd`` over recorded channels, configured from the workers' own answers
    (or with the handoff ``kv`` forced, and the operator's ``labels``)."""
    prefill_calls, decode_calls = Recorder(), Recorder()
    p = grpc.aio.insecure_channel(fleet.prefill, interceptors=[prefill_calls])
    d = grpc.aio.insecure_channel(fleet.decode, interceptors=[decode_calls])
    decode_info, decode_server = await info(fleet.decode)
    _, prefill_server = await info(fleet.prefill)
    handoff = kv or prefill_kv_from_info(prefill_server, fleet.prefill)
    capability = capability_from_info(decode_info, decode_server, labels=labels)
    return sequential_pd(p, d, capability, kv=handoff, timeout=60), prefill_calls, decode_calls


@pytest.mark.parametrize("mode", routers.MODES)
def test_images_a_b_a_match_one_full_vision_servicer(fleet: Fleet, mode: str) -> None:
    # Both routers, the one on messages and the one on bytes; each its own prompt, so that
    # neither finds the other's prefix cached.
    variant = f"abA-{mode}"

    async def main() -> None:
        expected = [await baseline(fleet, request(fleet, variant, seed)) for seed in (1, 2)]
        assert expected[0].tokens != expected[1].tokens  # else matching would prove nothing
        with routers.mode(mode):
            pd, prefill_calls, decode_calls = await sequential(fleet)
        served = [await streamed(pd.generate(request(fleet, variant, s))) for s in (1, 2, 1)]
        assert [s.tokens for s in served] == [expected[0].tokens, expected[1].tokens,
                                              expected[0].tokens]  # fmt: skip
        # The decode servicer loaded the prefill's KV for A and for B, and its own prefix
        # cache (the servicer folds the hashes into the salt) hit for A again, not for B.
        # The first block holds only the image's ids, before the variant's text: the
        # second router's run finds it cached from the first's, under the same salt.
        first, b, again = (s.kv_report for s in served)
        assert first["loaded_tokens"] > 0 and b["loaded_tokens"] > 0
        cached = (first["local_cached_tokens"], b["local_cached_tokens"])
        assert cached == ((0, 0) if mode == routers.MODES[0] else (BLOCK_SIZE, BLOCK_SIZE))
        assert again["local_cached_tokens"] > max(cached)
        assert (prefill_calls.generates, decode_calls.generates) == (3, 3)

    asyncio.run(main())


def test_refusals_never_send_a_generate_to_a_worker_that_should_not_get_one(
    fleet: Fleet,
) -> None:
    async def main() -> None:
        # This decode servicer is a KV consumer with an encoder budget: it takes metadata.
        pd, prefill_calls, decode_calls = await sequential(fleet)
        assert pd.candidates[0].worker.takes_mm_metadata
        # An M-RoPE request whose grid is not inline, and n>1 with an image: 400s before
        # any request.
        shm_grid = to_proto(mrope_request(grid_location=PayloadLocation.SHM))
        for message, error in (
            (shm_grid, MropeOnLanguageModelOnlyDecode),
            (request(fleet, "n2", 1, n=2), NSamplesOnLanguageModelOnlyDecode),
        ):
            with pytest.raises(error) as caught:
                await streamed(pd.generate(message))
            assert caught.value.status == 400
        # An operator who says the worker takes no metadata: any M-RoPE request is refused.
        said_no, no_prefill, no_decode = await sequential(
            fleet, labels={"accepts_mm_metadata": "false"}
        )
        with pytest.raises(MropeOnLanguageModelOnlyDecode):
            await streamed(said_no.generate(to_proto(mrope_request())))
        assert prefill_calls.methods == [] and decode_calls.methods == []
        assert no_prefill.methods == [] and no_decode.methods == []
        # A prefill that hands nothing off (left untagged, it stores nothing): the 502,
        # after the prefill and before any decode request.
        untagged, prefill_calls, decode_calls = await sequential(
            fleet, kv=KvConnectorMode.PASSTHROUGH
        )
        with pytest.raises(MissingKvTransferParams) as missing:
            await streamed(untagged.generate(request(fleet, "silent", 1)))
        assert missing.value.status == 502 and not missing.value.retryable
        assert (prefill_calls.generates, decode_calls.generates) == (1, 0)
        # Text n>1: decode runs alone, and recomputes the prompt.
        text = await streamed(untagged.generate(request(fleet, "text-n2", None)))
        assert text.tokens == (await baseline(fleet, request(fleet, "text-n2", None))).tokens

    asyncio.run(main())


def test_the_router_example_of_the_docs_runs_verbatim(fleet: Fleet) -> None:
    route = load_route()

    async def main() -> None:
        message = request(fleet, "docs", 3)
        status, tokens = await route(message, fleet.prefill, fleet.decode)
        assert status == 200
        assert tokens == (await baseline(fleet, request(fleet, "docs", 3))).tokens
        status, body = await route(request(fleet, "docs-n2", 3, n=2), fleet.prefill, fleet.decode)
        assert status == 400
        assert json.loads(body)["error"]["code"] == "pd_decode_language_model_only_n_samples"

    asyncio.run(main())


def test_policy_errors_leave_the_servicers_serving(fleet: Fleet) -> None:
    async def main() -> None:
        pd, _, _ = await sequential(fleet)
        with pytest.raises(PolicyError):
            await streamed(pd.generate(request(fleet, "after", 1, n=3)))
        served = await streamed(pd.generate(request(fleet, "after", 1)))
        assert served.tokens == (await baseline(fleet, request(fleet, "after", 1))).tokens

    asyncio.run(main())


def test_a_fleet_routes_around_a_killed_decode_and_readmits_it_as_what_it_came_back_as(
    fleet: Fleet,
) -> None:
    # FleetPd over the prefill and both language-model-only decodes, read from their own
    # answers. Every answer must equal the full-vision baseline's, through the kill too.
    assert fleet.second_server is not None and fleet.root is not None
    root = fleet.root
    transfers = root / "transfers"

    async def main() -> None:
        expected = {s: await baseline(fleet, request(fleet, "fleet", s)) for s in (1, 2)}
        assert expected[1].tokens != expected[2].tokens
        now = [0.0]
        pd = FleetPd(Roster(clock=lambda: now[0]), attempts=2, timeout=60)
        calls = {a: Recorder() for a in (fleet.prefill, fleet.decode, fleet.second)}
        # A short reconnect backoff, as a router over restarting workers wants.
        options = [
            ("grpc.initial_reconnect_backoff_ms", 500),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        channels = {a: grpc.aio.insecure_channel(a, options=options, interceptors=[calls[a]])
                    for a in calls}  # fmt: skip
        for role, address in (("prefill", fleet.prefill), ("decode", fleet.decode),
                              ("decode", fleet.second)):  # fmt: skip
            pd.add(role, await describe_worker(channels[address], address, role))
        second = pd.roster.of("decode")[1]

        async def check(seed: int, rid: str) -> None:
            got = await streamed(pd.generate(request(fleet, "fleet", seed, rid=rid)))
            assert got.tokens == expected[seed].tokens

        # Concurrent requests spread over both decodes.
        await asyncio.gather(*(check(1 + i % 2, f"spread-{i}") for i in range(4)))
        assert calls[fleet.decode].generates >= 1 and calls[fleet.second].generates >= 1
        # Kill the second decode mid-run: each request in flight is answered right or
        # fails typed (its stream was cut); none hangs, and none is answered wrong.
        running_ = [asyncio.ensure_future(check(1 + i % 2, f"kill-{i}")) for i in range(4)]
        await asyncio.sleep(0.2)
        fleet.second_server.signal(signal.SIGKILL)
        fleet.second_server.process.wait()
        outcomes = await asyncio.wait_for(
            asyncio.gather(*running_, return_exceptions=True), timeout=120
        )
        assert all(o is None or isinstance(o, PolicyError) for o in outcomes), outcomes
        # After it: every request routes around it, with the right answers.
        for i in range(3):
            await check(1 + i % 2, f"around-{i}")
        await pd.probe_once()
        assert second.health.health is Health.EJECTED
        # It comes back with its vision tower: re-read as a full-vision decode.
        server = servicer(
            "llava-decode-2",
            fleet.model,
            root,
            kv_role="kv_consumer",
            transfer_dir=transfers,
            port=int(fleet.second.rsplit(":", 1)[1]),
        )
        server.start()
        try:
            server.wait_ready(time.monotonic() + 240)
            # Probed on a timer, as a router does: the channel reconnects on its own backoff,
            # so the first probes after the restart may still fail.
            deadline = time.monotonic() + 90
            while not routable(second.health) and time.monotonic() < deadline:
                now[0] += 60
                await pd.probe_once()
                await asyncio.sleep(1)
            assert routable(second.health)  # re-admitted
            assert not second.worker.capability.language_model_only
            before = calls[fleet.second].generates
            await asyncio.gather(*(check(1 + i % 2, f"back-{i}") for i in range(4)))
            assert calls[fleet.second].generates > before  # routed to again
        finally:
            await pd.aclose()
            for channel in channels.values():
                await channel.close()
            stop_all([server])

    asyncio.run(main())

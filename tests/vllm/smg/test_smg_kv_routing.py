"""KV-event routing against SMG's real vLLM servicer on the tiny Qwen2-VL: the block
hashes its engine publishes are the ones the router computes for the request it sent.

One full-vision servicer publishes its KV events on loopback ``ipc://`` sockets (its
``--kv-events-config``); the router follows them with
[`KvRouting`][pd_policy_grpc.kv_routing.KvRouting], as a ``FleetPd`` would, and looks up
each request once the servicer has served it: a router-preprocessed image (each item
named by its ``mm_hashes`` entry), its bare identity (the servicer's ``"mm:"`` salt), and
the same ids with another image or none (nothing held).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator

import attrs
import pytest
from live_engines import BLOCK_SIZE
from qwen_prompts import prompt
from router_side import image, router_request
from servers import running
from smg_peers import servicer, streamed
from tiny_models import TinyModel

import grpc
from pd_policy import Roster
from pd_policy_grpc import clone_without_mm
from pd_policy_grpc.fleet import GrpcWorker, describe_worker
from pd_policy_grpc.kv_routing import KvPublisher, KvRouting
from pd_policy_grpc.wire import pb, pb_grpc


@attrs.frozen
class Peer:
    address: str
    publisher: KvPublisher
    model: TinyModel


@pytest.fixture(scope="module")
def peer(qwen2vl: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    root = tmp_path_factory.mktemp("smg-kv")
    sockets = tempfile.mkdtemp(prefix="kv", dir="/tmp")  # an ipc path is short
    publisher = KvPublisher(f"ipc://{sockets}/events", replay=f"ipc://{sockets}/replay")
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": publisher.endpoint,
        "replay_endpoint": publisher.replay,
    }
    extra = ("--kv-events-config", json.dumps(config))
    server = servicer("kv-prefill", qwen2vl, root, extra=extra)
    try:
        with running([server]):
            yield Peer(server.address, publisher, qwen2vl)
    finally:
        shutil.rmtree(sockets, ignore_errors=True)


def request(peer: Peer, seed: int | None, rid: str) -> pb.GenerateRequest:
    """The ``kv`` prompt with image ``seed`` first (``None``: the same ids, no media)."""
    message = router_request(
        str(peer.model.path),
        prompt("kv"),
        [image(seed, side=112)] if seed is not None else [image(1, side=112)],
        image_token_id=peer.model.image_token_id,
        request_id=rid,
        max_tokens=1,
    )
    if seed is None:
        message.ClearField("mm_inputs")
    return message


def test_the_router_names_the_blocks_the_servicers_engine_publishes(peer: Peer) -> None:
    async def main() -> None:
        async with grpc.aio.insecure_channel(peer.address) as channel:
            worker = await describe_worker(channel, peer.address, "prefill")
            assert (worker.block_size, worker.data_parallel_size) == (BLOCK_SIZE, 1)
            roster: Roster[GrpcWorker] = Roster(clock=lambda: 0.0)
            roster.add_member("prefill", peer.address, worker)
            routing = KvRouting({peer.address: peer.publisher})
            stub = pb_grpc.VllmEngineStub(channel)

            async def served(message: pb.GenerateRequest) -> int:
                """Serve ``message``; the blocks the router then finds the engine holds."""
                await streamed(stub.Generate(message, timeout=60))
                async with asyncio.timeout(30):
                    while True:
                        lookup = routing.lookup(roster, message)
                        if lookup is not None and lookup.cached[peer.address]:
                            return lookup.cached[peer.address]
                        await asyncio.sleep(0.1)

            async with routing.running(roster, interval=0.1):
                with_image = request(peer, 1, "pixels")
                blocks = await served(with_image)
                assert blocks == len(with_image.tokenized.input_ids) // BLOCK_SIZE
                identity = clone_without_mm(with_image)
                identity.request_id = "identity"
                assert not identity.mm_inputs.HasField("pixel_values")
                assert await served(identity) == blocks  # salted: blocks of their own
                for other in (request(peer, 2, "other"), request(peer, None, "text")):
                    lookup = routing.lookup(roster, other)
                    assert lookup is not None and lookup.cached == {peer.address: 0}
                assert routing.index.held(peer.address) >= 2 * blocks

    asyncio.run(main())

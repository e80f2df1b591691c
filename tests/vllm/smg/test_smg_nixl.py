"""``FleetPd`` on SMG's real vLLM servicer over vLLM's own ``NixlConnector``: grid-less LLaVA,
a full-vision prefill to a ``--language-model-only`` decode, the KV pulled by NIXL.

Two servicer processes of the tiny LLaVA, started once for this module on 127.0.0.1 and
stopped by process id: a full-vision prefill (``kv_producer``), which also answers as a full
servicer when sent a request without the handoff, and a ``--language-model-only`` decode
(``kv_consumer``), both with their KV in host memory, each with a NIXL side channel of its
own and NIXL's progress thread off (the tests' switch, ``nixl_peers``). ``FleetPd`` learns
the NIXL handoff from the prefill's own ``GetServerInfo`` (its ``kv_connector``).

A transfer is proven by the decode's NIXL metrics, read before and after each request: the
Python servicer serves no ``/metrics``, so the decode runs under
``grpc_metrics_launcher.py``, which serves its launcher's Prometheus registry on a
loopback port. Never by ``cached_tokens``, which only repeats what the prefill reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Iterator
from typing import Final

import attrs
import pytest
from live_engines import BLOCK_SIZE
from llava_prompts import TEXT
from nixl_peers import (
    LLAVA_BLOCK_BYTES,
    SWITCH_MARK,
    Transfer,
    nixl_config,
    nixl_worker,
    progress_thread_off,
)
from router_side import image, router_request
from servers import Server, running
from smg_peers import Streamed, metrics_url, servicer, streamed
from tiny_models import TinyModel

import grpc
from pd_policy import KvConnectorMode
from pd_policy.decode_kv import KvLoad
from pd_policy_grpc.fleet import FleetPd, describe_worker
from pd_policy_grpc.wire import pb, pb_grpc

#: The decode's requests and the baseline's, one greedy answer each.
MAX_TOKENS: Final = 8


@attrs.frozen
class Pair:
    prefill: str
    decode: str
    #: Where the decode serves vLLM's Prometheus metrics: NIXL's counters of its pulls.
    decode_metrics: str
    model: TinyModel
    servers: tuple[Server, Server]

    @property
    def baseline(self) -> str:
        """A full-vision servicer to match: the prefill, sent requests without the handoff."""
        return self.prefill


@pytest.fixture(scope="module")
def pair(llava: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("smg-nixl")
    prefill = servicer("nixl-prefill", llava, root, kv_config=nixl_config("kv_producer"))
    decode = servicer(
        "nixl-decode", llava, root, language_model_only=True,
        kv_config=nixl_config("kv_consumer"), metrics=True,
    )  # fmt: skip
    nixl_worker(prefill)
    nixl_worker(decode)
    with running([prefill, decode]):
        yield Pair(prefill.address, decode.address, metrics_url(decode), llava, (prefill, decode))


def request(pair: Pair, variant: str, seed: int | None, rid: str) -> pb.GenerateRequest:
    """A LLaVA request over four 32-id blocks; ``seed`` picks the image (``None``: text)."""
    if seed is None:
        prompt = f"USER: {variant} {TEXT}\nASSISTANT:"
        return router_request(str(pair.model.path), prompt, request_id=rid,
                              max_tokens=MAX_TOKENS)  # fmt: skip
    return router_request(
        str(pair.model.path),
        f"USER: <image>\n{variant} {TEXT}\nASSISTANT:",
        [image(seed)],
        image_token_id=pair.model.image_token_id,
        request_id=rid,
        max_tokens=MAX_TOKENS,
    )


async def baseline(pair: Pair, message: pb.GenerateRequest) -> Streamed:
    async with grpc.aio.insecure_channel(pair.baseline) as channel:
        return await streamed(pb_grpc.VllmEngineStub(channel).Generate(message, timeout=60))


@contextlib.asynccontextmanager
async def fleet(pair: Pair) -> AsyncIterator[FleetPd]:
    """A ``FleetPd`` over the pair, each worker described by its own answers."""
    pd = FleetPd(timeout=60)
    channels = [grpc.aio.insecure_channel(a) for a in (pair.prefill, pair.decode)]
    try:
        for role, address, channel in zip(("prefill", "decode"), (pair.prefill, pair.decode),
                                          channels, strict=True):  # fmt: skip
            pd.add(role, await describe_worker(channel, address, role))
        yield pd
    finally:
        await pd.aclose()
        for channel in channels:
            await channel.close()


def test_fleetpd_reads_nixl_from_each_workers_server_info(pair: Pair) -> None:
    async def main() -> None:
        async with fleet(pair) as pd:
            (prefill,) = pd.roster.of("prefill")
            (decode,) = pd.roster.of("decode")
            assert prefill.worker.kv is not None
            assert prefill.worker.kv.mode is KvConnectorMode.NIXL
            assert decode.worker.capability.language_model_only
            # NIXL loads the blocks the handoff names. The servicer does not report its
            # load-failure policy: unknown, so it does not bar the stripped leg.
            assert decode.worker.capability.decode_kv.loads is KvLoad.BY_REQUEST
        for address, role in ((pair.prefill, "kv_producer"), (pair.decode, "kv_consumer")):
            async with grpc.aio.insecure_channel(address) as channel:
                info = await pb_grpc.VllmEngineStub(channel).GetServerInfo(
                    pb.GetServerInfoRequest(), timeout=10
                )
            assert (info.kv_connector, info.kv_role) == ("NixlConnector", role)

    asyncio.run(main())
    for server in pair.servers:
        assert (SWITCH_MARK in server.log.read_text()) is progress_thread_off()


def test_images_a_b_a_through_fleetpd_equal_a_full_vision_servicer(pair: Pair) -> None:
    async def main() -> None:
        expected = {s: await baseline(pair, request(pair, "abA", s, f"base-{s}")) for s in (1, 2)}
        assert expected[1].tokens != expected[2].tokens  # else matching would prove nothing
        moved = []
        async with fleet(pair) as pd:
            for i, seed in enumerate((1, 2, 1)):
                message = request(pair, "abA", seed, f"pd-{i}")
                with Transfer(pair.decode_metrics) as transfer:
                    got = await streamed(pd.generate(message))
                assert got.tokens == expected[seed].tokens, seed
                moved.append(transfer.bytes)
        # A and B: every block of the prompt, the partial last one included. A again: the
        # decode's own cache (under the servicer's salt of the image's hash) held A's whole
        # blocks, and B's salt kept it from holding any of B's: only the partial one moved.
        ids = len(message.tokenized.input_ids)
        assert ids % BLOCK_SIZE  # the prompt ends in a partial block
        blocks = math.ceil(ids / BLOCK_SIZE)
        assert moved == [blocks * LLAVA_BLOCK_BYTES] * 2 + [LLAVA_BLOCK_BYTES]

    asyncio.run(main())


def test_text_through_fleetpd_equals_a_full_servicer(pair: Pair) -> None:
    async def main() -> None:
        want = await baseline(pair, request(pair, "text", None, "base-text"))
        async with fleet(pair) as pd:
            with Transfer(pair.decode_metrics):
                got = await streamed(pd.generate(request(pair, "text", None, "pd-text")))
            assert got.tokens == want.tokens

    asyncio.run(main())

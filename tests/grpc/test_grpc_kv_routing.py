"""KV-event routing in ``FleetPd``: stand-in prefills whose caches vLLM's own publisher
announces, with the block hashes the engine behind SMG's servicer gives each request
(``kv_peers``): the prefill that holds a request's prefix takes it within the load bound,
another image behind the same tokens counts none of it, and a prefill whose feed is not
in sync, or whose blocks the router cannot name, is routed by the rules without it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import attrs
import pytest
from engines import serve_address
from hypothesis import event, given
from hypothesis import strategies as st
from kv_peers import BLOCK, Decode, Prefill, Publisher, engine_chain, image, text

import grpc
from pd_policy import InvalidConfiguration, Roster, rendezvous_order
from pd_policy.cache.kv_blocks import BlockHasher, external_hash
from pd_policy_grpc.blocks import block_prompt
from pd_policy_grpc.client import SequentialPd
from pd_policy_grpc.fleet import FleetPd, GrpcWorker, PairRouter, describe_worker
from pd_policy_grpc.kv_routing import KvPublisher, KvRouting
from pd_policy_grpc.raw.client import SequentialPdBytes
from pd_policy_grpc.raw.reader import read_request
from pd_policy_grpc.wire import common, pb


@attrs.define
class Stand:
    fleet: FleetPd
    routing: KvRouting
    prefills: list[Prefill]
    publishers: list[Publisher]
    names: list[str]  # the prefills' member names, in the engines' order


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


@asynccontextmanager
async def stand(
    *, bytes_router: bool = False, replay: bool = True, prefills: list[Prefill] | None = None
) -> AsyncIterator[Stand]:
    """Two prefills (``a`` and ``b``) publishing to a router, one language-model-only
    decode; the feeds are up (a batch of each applied) when it yields, when they can be."""
    engines = prefills if prefills is not None else [Prefill(), Prefill()]
    folder = tempfile.mkdtemp(prefix="kv", dir="/tmp")  # an ipc path is short
    publishers = [Publisher(folder, "ab"[i], replay) for i in range(len(engines))]
    router: PairRouter = SequentialPdBytes if bytes_router else SequentialPd
    routing = KvRouting(seed=os.environ.get("PYTHONHASHSEED"))
    fleet = FleetPd(Roster(clock=lambda: 0.0), router=router, kv_routing=routing)
    try:
        async with AsyncExitStack() as stack:
            names: list[str] = []
            for role, engine in [*(("prefill", p) for p in engines), ("decode", Decode())]:
                address = await stack.enter_async_context(serve_address(engine))
                channel = await stack.enter_async_context(grpc.aio.insecure_channel(address))
                fleet.add(role, await describe_worker(channel, address, role))
                if role == "prefill":
                    routing.publishers[address] = publishers[len(names)].stated()
                    names.append(address)
            await stack.enter_async_context(routing.running(fleet.roster, interval=0.05))
            if replay:
                # Empty batches until each feed applied one: its socket has joined.
                def joined() -> bool:
                    feeds = routing.feeds
                    assert feeds is not None
                    return all((s := feeds.stats(n)) is not None and s.applied for n in names)

                async with asyncio.timeout(10):
                    while not joined():
                        for publisher in publishers:
                            publisher.publish()
                        await asyncio.sleep(0.05)
            yield Stand(fleet, routing, engines, publishers, names)
            await fleet.aclose()
    finally:
        for publisher in publishers:
            publisher.vllm.shutdown()
        shutil.rmtree(folder, ignore_errors=True)


def homed_on(names: list[str], index: int, prefix: str = "img") -> str:
    """A content hash whose rendezvous home (the affinity rule's choice) is ``names[index]``."""
    for i in range(1000):
        digest = f"{prefix}-{i}".ljust(64, "0")
        if rendezvous_order(digest, names)[0] == index:
            return digest
    raise AssertionError("no hash found")


async def announce(s: Stand, index: int, chain: list[int]) -> None:
    """Publish ``chain`` as cached by prefill ``index`` until the router holds it (a
    subscriber without a replay socket misses what comes before it joined)."""
    async with asyncio.timeout(10):
        while s.routing.index.held(s.names[index]) < len(chain):
            s.publishers[index].publish(chain)
            await asyncio.sleep(0.05)


def run(test: Callable[..., Awaitable[None]], **kwargs: Any) -> None:
    async def main() -> None:
        async with stand(**kwargs) as s:
            await test(s)

    asyncio.run(main())


@pytest.mark.parametrize(
    "request_",
    [
        image("a" * 64),
        image("b" * 64, pixels=False),  # the servicer's salt: "mm:" and the hashes
        image("b" * 64, pixels=False, placed=True),  # no payload: still the salt
        text(),
    ],
    ids=["pixels", "identity", "placed-identity", "text"],
)
def test_the_router_names_a_request_as_the_engine_behind_smg_does(
    request_: pb.GenerateRequest,
) -> None:
    prompt = block_prompt(request_)
    assert prompt is not None
    ours = BlockHasher(BLOCK, seed=os.environ.get("PYTHONHASHSEED")).hashes(
        prompt.token_ids, prompt.items, cache_salt=prompt.cache_salt
    )
    assert [external_hash(h) for h in ours] == engine_chain(request_)
    assert len(ours) == 4


digests = st.sampled_from([c * 64 for c in "abcd"])


@given(st.lists(st.lists(digests, min_size=1, max_size=3), min_size=1, max_size=3),
       st.booleans(), st.booleans())  # fmt: skip
def test_the_bare_identities_of_every_batch_salt_the_blocks_as_the_servicer_does(
    batches: list[list[str]], primary: bool, placed: bool
) -> None:
    # A decode leg's form: hashes without payload, in the primary batch or the extras
    # (one per modality). The servicer salts it with the hashes of every batch, in order.
    request = text()
    for i, hashes in enumerate(batches):
        batch = request.mm_inputs if primary and i == 0 else request.extra_mm_inputs.add()
        batch.mm_hashes.extend(hashes)
        batch.modality = (common.IMAGE, common.VIDEO)[i % 2]
        if placed:
            batch.mm_placeholders.add(offset=4, length=16)
    count = ("one batch", "two batches", "three batches")[len(batches) - 1]
    event(count + (", the first primary" if primary else ", extras only"))
    prompt = block_prompt(request)
    assert prompt is not None
    ours = BlockHasher(BLOCK, seed=os.environ.get("PYTHONHASHSEED")).hashes(
        prompt.token_ids, prompt.items, cache_salt=prompt.cache_salt
    )
    assert [external_hash(h) for h in ours] == engine_chain(request)


def test_what_the_router_cannot_name_as_the_engine_will_is_not_looked_up() -> None:
    as_text = text()
    as_text.text = "hello"  # the worker tokenizes
    refs = text()
    refs.media_refs.items.add(modality=common.IMAGE, url="https://example.com/a.png")
    cut = image("a" * 64)
    cut.sampling_params.truncate_prompt_tokens = 32
    unpaired = image("a" * 64)
    unpaired.mm_inputs.mm_hashes.append("c" * 64)  # two hashes, one placeholder
    for request in (as_text, refs, cut, unpaired):
        assert block_prompt(request) is None
    # A bare identity beside a batch with its payload: the servicer reads the latter only.
    mixed = image("a" * 64)
    mixed.extra_mm_inputs.add(mm_hashes=["d" * 64], modality=common.VIDEO)
    assert block_prompt(mixed) == block_prompt(image("a" * 64))
    assert block_prompt(mixed) is not None and engine_chain(mixed) == engine_chain(image("a" * 64))


def test_an_endpoint_the_router_cannot_connect_to_is_refused() -> None:
    for endpoint in ("tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://host:0", "ipc://", "udp://h:1"):
        with pytest.raises(InvalidConfiguration):
            KvPublisher(endpoint)
    with pytest.raises(InvalidConfiguration):
        KvPublisher("tcp://10.0.0.5:5557", replay="tcp://*:5558")
    assert KvPublisher("tcp://[::1]:5557", replay="ipc:///run/kv-replay").replay


@pytest.mark.parametrize("bytes_router", [False, True])
def test_a_request_goes_to_the_prefill_holding_its_prefix_though_busier_within_the_bound(
    bytes_router: bool,
) -> None:
    async def test(s: Stand) -> None:
        a, b = s.prefills
        digest = homed_on(s.names, 1)  # affinity alone would send it to b
        await announce(s, 0, engine_chain(image(digest)))
        a.hold_first.set()

        def serve(rid: str) -> asyncio.Task[list[Any]]:
            message = image(digest, rid)
            request: Any = message.SerializeToString() if bytes_router else message

            async def go() -> list[Any]:
                return [r async for r in s.fleet.generate(request)]

            return asyncio.ensure_future(go())

        first = serve("r1")
        await until(lambda: len(a.requests) == 1)
        second = serve("r2")  # a has one in flight, b none: a holds all 4 blocks
        await until(lambda: len(a.requests) == 2)
        # Two in flight on a: one more is past the bound, ceil(1.25 * 3 / 2) = 2.
        third = serve("r3")
        await until(lambda: len(b.requests) == 1)
        a.release.set()
        assert all(await asyncio.gather(first, second, third))
        # The first two went to a (each under an id of the router's own), the third to b.
        ids = {r.request_id for r in a.requests}
        assert len(ids) == 2 and not ids & {"r1", "r2", "r3"}
        assert s.routing.outcomes == {"hit": 2, "miss": 1}
        assert s.routing.blocks == {"cached": 8, "computed": 4}

    run(test, bytes_router=bytes_router)


def test_another_image_behind_the_same_tokens_counts_none_of_the_holders_blocks() -> None:
    async def test(s: Stand) -> None:
        a_name, b_name = s.names
        await announce(s, 0, engine_chain(image("a" * 64)))
        await announce(s, 1, engine_chain(image("b" * 64, pixels=False)))
        lookup = s.routing.lookup(s.fleet.roster, image("a" * 64))
        assert lookup is not None and lookup.cached == {a_name: 4, b_name: 0}
        other = s.routing.lookup(s.fleet.roster, image("c" * 64))
        assert other is not None and other.cached == {a_name: 0, b_name: 0}
        # The bare identities: the salt names the image, as the servicer folds it.
        bare = s.routing.lookup(s.fleet.roster, image("b" * 64, pixels=False))
        assert bare is not None and bare.cached == {a_name: 0, b_name: 4}
        for request in (image("c" * 64, pixels=False), text()):
            looked = s.routing.lookup(s.fleet.roster, request)
            assert looked is not None and looked.cached == {a_name: 0, b_name: 0}
        # A bytes router's skeleton is looked up as its message.
        raw = read_request(image("a" * 64).SerializeToString())
        assert s.routing.lookup(s.fleet.roster, raw.skeleton) == lookup
        many = image("a" * 64)
        many.sampling_params.n = 2  # no prefill runs
        assert s.routing.lookup(s.fleet.roster, many) is None

    run(test)


def test_a_prefill_whose_feed_is_not_in_sync_is_routed_by_the_rules() -> None:
    async def test(s: Stand) -> None:
        a, b = s.prefills
        digest = homed_on(s.names, 1)
        chain = engine_chain(image(digest))
        # No replay socket, and nothing published yet: the router has not heard of a.
        await asyncio.sleep(0.3)
        assert s.routing.lookup(s.fleet.roster, image(digest)) is None
        assert [r async for r in s.fleet.generate(image(digest, "before"))]
        assert [len(a.requests), len(b.requests)] == [0, 1]
        await announce(s, 0, chain)
        assert [r async for r in s.fleet.generate(image(digest, "held"))]
        assert [len(a.requests), len(b.requests)] == [1, 1]
        # Batches lost past what a replay could give: a counts for nothing until read again.
        assert s.routing.index.feed(s.names[0], 10**6, []) == "gap"
        assert [r async for r in s.fleet.generate(image(digest, "lost"))]
        assert [len(a.requests), len(b.requests)] == [1, 2]
        assert s.routing.outcomes == {"fallback": 2, "hit": 1}

    run(test, replay=False)


def test_a_prefill_that_does_not_say_how_it_names_blocks_is_not_followed() -> None:
    async def test(s: Stand) -> None:
        await until(lambda: len(s.routing.unfed) == 2)
        assert s.routing.unfed == {
            s.names[0]: "its GetServerInfo states no block size",
            s.names[1]: "it runs more than one data-parallel rank",
        }
        assert s.routing.feeds is not None and not s.routing.feeds.sources
        assert s.routing.lookup(s.fleet.roster, image("a" * 64)) is None

    run(test, replay=False, prefills=[Prefill(block_size=0), Prefill(ranks=2)])


def test_the_fleet_reads_each_prefills_block_size_from_its_server_info() -> None:
    async def test(s: Stand) -> None:
        for member in s.fleet.roster.of("prefill"):
            worker: GrpcWorker = member.worker
            assert (worker.block_size, worker.data_parallel_size) == (BLOCK, 1)
        decode = s.fleet.roster.of("decode")[0].worker
        assert (decode.block_size, decode.data_parallel_size) == (0, 1)  # the engine's 0

    run(test, replay=False)

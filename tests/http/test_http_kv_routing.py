"""``pd-policy-proxy --kv-routing`` over stand-in prefills that cache blocks and publish
vLLM's KV events (``tests/kv_stub.py``): a request goes to the prefill that holds its
prefix, the prediction is what the worker then reports it held, the load bound wins over
the cache, and nothing a worker renders or publishes can do worse than a cache miss.

The fleet balances round robin, so that without the cache's rule a follow-up would go to
the other prefill: a request that lands on its holder landed there because of its blocks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import attrs
import pytest
from fleet_stands import serving

from kv_stub import KvStub, StubConfig, StubFleet, kv_stubs
from pd_policy_vllm.http.cli import main, read_fleet
from pd_policy_vllm.http.flags import kv_routing, parser
from pd_policy_vllm.http.proxy import Proxy

CONFIG = StubConfig(block_size=16, capacity=256, image_tokens=40)
PNG_X, PNG_Y = b"\x89PNG image x" * 8, b"\x89PNG image y" * 8


def chat(
    *turns: str, image: bytes | None = None, salt: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A chat body: the system prompt, the image (if any) and the user's turns."""
    content: list[dict[str, Any]] = [{"type": "text", "text": " ".join(turns)}]
    if image is not None:
        url = "data:image/png;base64," + base64.b64encode(image).decode()
        content.insert(0, {"type": "image_url", "image_url": {"url": url}})
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 4, **extra,
                            "messages": [{"role": "system", "content": "you help " * 12},
                                         {"role": "user", "content": content}]}  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    return body


@attrs.define
class Rig:
    url: str
    stubs: StubFleet
    proxy: Proxy
    session: aiohttp.ClientSession

    async def post(self, body: Any) -> tuple[int, Any]:
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as answer:
            return answer.status, await answer.json()

    async def metric(self, name: str, **labels: str) -> float:
        async with self.session.get(self.url + "/metrics") as answer:
            text = await answer.text()
        want = ",".join(f'{k}="{v}"' for k, v in labels.items())
        pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" (\S+)"
        found = re.search(pattern, text)
        return float(found.group(1)) if found else 0.0

    def served(self) -> list[tuple[str, int, int]]:
        """Every prefill leg the stand-ins served: (worker, prompt tokens, cached tokens)."""
        rows = [
            (r.worker, r.prompt_tokens, r.cached_tokens)
            for p in self.stubs.prefills
            for r in p.records
        ]
        return sorted(rows, key=lambda row: row[0])

    def last(self, stub: KvStub) -> tuple[int, int]:
        record = stub.records[-1]
        return record.prompt_tokens, record.cached_tokens

    async def settled(self) -> None:
        """Every block the stand-ins stored is in the proxy's index."""
        routing = self.proxy.kv_routing
        assert routing is not None
        async with asyncio.timeout(10):
            while any(
                routing.index.held(_name(self, p)) != len(p.cache) for p in self.stubs.prefills
            ):
                await asyncio.sleep(0.02)

    async def predicted(self) -> float:
        return await self.metric("pd_policy_kv_blocks_total", kind="cached")


def _name(rig: Rig, stub: KvStub) -> str:
    return next(m.name for m in rig.proxy.fleet.of("prefill") if m.worker.url == stub.url)


@contextlib.asynccontextmanager
async def rig(prefills: int = 2, config: StubConfig = CONFIG, *flags: str) -> AsyncIterator[Rig]:
    async with kv_stubs(prefills, 1, config) as stubs:
        argv = [a for p in stubs.prefills for a in ("--prefill", p.url)]
        argv += ["--decode", stubs.decodes[0].url, "--kv-routing", "--balance", "round_robin"]
        args = parser().parse_args([*argv, *flags])
        fleet = await read_fleet(args)
        proxy = Proxy(
            fleet=fleet, mrope=False, kv_routing=kv_routing(args), render_once=args.render_once
        )
        async with serving(proxy.app()) as url, aiohttp.ClientSession() as session:
            made = Rig(url, stubs, proxy, session)
            routing = proxy.kv_routing
            assert routing is not None
            async with asyncio.timeout(10):
                while not all(routing.index.synced(m.name) for m in fleet.of("prefill")):
                    await asyncio.sleep(0.02)
            yield made


def run(test: Callable[[], Any]) -> None:
    asyncio.run(test())


def test_a_follow_up_lands_on_the_prefill_that_holds_its_image() -> None:
    async def main() -> None:
        async with rig() as r:
            p0, p1 = r.stubs.prefills
            assert (await r.post(chat("describe it", image=PNG_X)))[0] == 200
            assert [s[0] for s in r.served()] == ["p0"]  # the first turn
            await r.settled()
            # Round robin's next turn is p1; the blocks of the image are p0's.
            follow_up = chat("describe it", "and now its colours", image=PNG_X)
            assert (await r.post(follow_up))[0] == 200
            assert len(p0.records) == 2 and not p1.records
            tokens, cached = r.last(p0)
            predicted = await r.predicted()
            assert predicted > 0 and await r.metric("pd_policy_kv_routing_total", outcome="hit")
            # The worker held what the proxy predicted (never the last token's block).
            assert cached == min(int(predicted), (tokens - 1) // CONFIG.block_size) * 16

    run(main)


def test_another_image_or_salt_behind_the_same_text_is_predicted_as_the_worker_holds_it() -> None:
    async def main() -> None:
        async with rig() as r:
            p0, p1 = r.stubs.prefills
            await r.post(chat("describe it", image=PNG_X))
            await r.settled()
            # Image Y, same words: only the blocks wholly before the image are p0's (the
            # system prompt), the image's and everything after are not.
            before = await r.predicted()
            await r.post(chat("describe it", image=PNG_Y))
            held = await r.predicted() - before
            system_blocks = (1 + 1 + 24 + 1 + 1) // CONFIG.block_size  # BOS, roles, words
            assert held == system_blocks == 1
            assert len(p0.records) == 2 and not p1.records  # those blocks are p0's
            assert r.last(p0)[1] == held * CONFIG.block_size
            # Another tenant's salt: nothing of p0's is theirs, from the first block.
            await r.settled()
            before, counts = await r.predicted(), [len(p.records) for p in r.stubs.prefills]
            assert (await r.post(chat("describe it", image=PNG_X, salt="tenant-b")))[0] == 200
            assert await r.predicted() == before
            (took,) = [
                p for p, n in zip(r.stubs.prefills, counts, strict=True) if len(p.records) > n
            ]
            assert r.last(took)[1] == 0  # placed by its turn: nothing held, nothing reported
            # Misses: the first request (nothing held anywhere) and the salted one.
            assert await r.metric("pd_policy_kv_routing_total", outcome="miss") == 2

    run(main)


def test_the_load_bound_wins_over_the_cache() -> None:
    async def main() -> None:
        slow = attrs.evolve(CONFIG, base=0.4)
        async with rig(2, slow) as r:
            p0, p1 = r.stubs.prefills
            await r.post(chat("describe it", image=PNG_X))
            await r.settled()
            # Three follow-ups at once, each a hit on p0: with two prefills the bound
            # (1.25 x the mean, this request counted) lets p0 hold two, not three.
            answers = await asyncio.gather(
                *(r.post(chat("describe it", f"turn {i}", image=PNG_X)) for i in range(3))
            )
            assert [status for status, _ in answers] == [200, 200, 200]
            assert len(p0.records) - 1 == 2 and len(p1.records) == 1

    run(main)


def test_a_hostile_or_failing_render_costs_the_prediction_never_the_request() -> None:
    hostile: list[tuple[int, Any]] = [
        (500, {"error": {"message": "render broke"}}),
        (200, {"token_ids": [-1, 2]}),
        (200, {"token_ids": [1, 2**40]}),
        (200, {"token_ids": "1,2,3"}),
        (200, [{"token_ids": [1]}, {"token_ids": [2]}]),
        (200, {"token_ids": [1, 2, 3], "features": {"mm_hashes": {"image": ["a", "b"]},
               "mm_placeholders": {"image": [{"offset": 0, "length": 2},
                                             {"offset": 1, "length": 2}]}}}),
        (200, {"token_ids": [1, 2, 3], "features": {"mm_hashes": {"image": ["a"]},
               "mm_placeholders": {"image": [{"offset": 2, "length": 9}]}}}),
        (200, {"token_ids": [1, 2, 3], "features": {"mm_hashes": {"image": ["a"]},
               "mm_placeholders": {}}}),
    ]  # fmt: skip

    async def main() -> None:
        async with rig() as r:
            for i, answer in enumerate(hostile):
                for stub in r.stubs.prefills:
                    stub.render_override = answer
                status, body = await r.post(chat("describe it", f"case {i}", image=PNG_X))
                assert status == 200, (answer, body)
            fallbacks = await r.metric("pd_policy_kv_routing_total", outcome="fallback")
            assert fallbacks == len(hostile)
            assert sum(p.generates for p in r.stubs.prefills) == 0  # nothing rendered once
            assert await r.metric("pd_policy_kv_routing_total", outcome="hit") == 0

    run(main)


def test_remote_media_and_refused_requests_reach_no_render() -> None:
    async def main() -> None:
        async with rig() as r:
            remote = chat("describe it")
            remote["messages"][1]["content"].insert(
                0, {"type": "image_url", "image_url": {"url": "http://203.0.113.5/x.png"}}
            )
            await r.post(remote)  # the proxy's to fetch or refuse: no worker reads it first
            status, _ = await r.post(chat("describe it", image=PNG_X, n=2))
            assert status == 400  # n > 1: refused by the policy, before any worker
            assert sum(p.renders for p in r.stubs.prefills) == 0
            assert not r.served()

    run(main)


def test_one_render_a_request_and_a_prefill_out_of_sync_counts_for_nothing() -> None:
    async def main() -> None:
        async with rig() as r:
            p0 = r.stubs.prefills[0]
            for i in range(3):
                assert (await r.post(chat("describe it", f"turn {i}", image=PNG_X)))[0] == 200
            assert sum(p.renders for p in r.stubs.prefills) == 3
            await r.settled()
            routing = r.proxy.kv_routing
            assert routing is not None
            # A batch far ahead of the last: events were lost, p0's blocks count for
            # nothing until it is consistent again.
            routing.index.feed(_name(r, p0), 10**9, [])
            assert not routing.index.synced(_name(r, p0))
            # Read before the next request: its own batch, the one after p0's last, would
            # bring p0 back in sync.
            assert await r.metric("pd_policy_kv_synced", worker=_name(r, p0)) == 0
            before = await r.metric("pd_policy_kv_routing_total", outcome="fallback")
            await r.post(chat("describe it", "turn 0", image=PNG_X))
            assert await r.metric("pd_policy_kv_routing_total", outcome="fallback") >= before

    run(main)


def test_the_flags_set_kv_routing_and_refuse_an_index_bound_below_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:9"]
    assert kv_routing(parser().parse_args(argv)) is None
    routing = kv_routing(parser().parse_args([*argv, "--kv-routing", "--kv-hash-seed", "7",
                                              "--kv-index-blocks", "64"]))  # fmt: skip
    assert routing is not None and routing.seed == "7" and routing.index.max_blocks == 64
    # Refused before any worker is called (none listens here).
    bad = [*argv, "--startup-timeout", "0", "--kv-routing", "--kv-index-blocks", "0"]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kv-index-blocks" in err


def test_the_lookup_asks_its_render_for_no_tensors_when_no_plan_takes_it() -> None:
    # A render answers each image's processed pixels by default: megabytes the lookup,
    # which reads ids, hashes and places, would only parse and drop.
    async def main() -> None:
        async with rig(2, CONFIG, "--no-render-once") as r:
            assert (await r.post(chat("describe it", image=PNG_X)))[0] == 200
            (asked,) = [p.last_render for p in r.stubs.prefills if p.last_render is not None]
            assert asked["mm_payload"] == "none" and asked["messages"][1]["content"][0]

    run(main)

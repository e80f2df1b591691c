"""The proxy over a fleet of stand-in workers: load spread, retries only where invisible,
ejection and re-admission as another kind, keys, metrics, the admin routes and IPv6.

The real ``vllm serve`` fleet is in ``tests/vllm/http/test_http_pool_fleet_live.py``;
these are the faults a real worker cannot be made to show on demand."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from fleet_stands import Stand, serving, stands

from pd_policy import Health, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker, capability_from_config
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.cli import read_fleet
from pd_policy_vllm.http.flags import parser
from pd_policy_vllm.http.fleet.members import Fleet, Member
from pd_policy_vllm.http.fleet.probe import Probe
from pd_policy_vllm.http.fleet.routing import HttpPlacer
from pd_policy_vllm.http.front_door import Incoming
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.planning import Planning
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.identity import WorkerMedia
from pd_policy_vllm.openai.plan.request import Route, policy_request

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
Test = Callable[[str, list[Stand], list[Stand], Proxy], Awaitable[None]]


def chat(seed: int = 0, *, stream: bool = False, image: bool = True) -> dict[str, Any]:
    parts: list[Any] = [{"type": "text", "text": f"what is it {seed}"}]
    if image:
        url = "data:image/png;base64," + "ABCD"[seed % 4] * 8
        parts.insert(0, {"type": "image_url", "image_url": {"url": url}})
    return {"model": "tiny", "messages": [{"role": "user", "content": parts}], "max_tokens": 4,
            "stream": stream}  # fmt: skip


async def post(url: str, body: Any, key: str | None = None) -> tuple[int, Any, str]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as session, session.post(
        f"{url}/v1/chat/completions", json=body, headers=headers
    ) as response:  # fmt: skip
        text = await response.text()
    try:
        return response.status, json.loads(text), text
    except json.JSONDecodeError:
        return response.status, None, text


def run(test: Test, prefills: int = 2, decodes: int = 2, **kwargs: Any) -> None:
    async def main() -> None:
        def make(fleet: Fleet) -> Proxy:
            return Proxy(fleet=fleet, mrope=False, **kwargs)

        async with stands(prefills, decodes, make) as (url, ps, ds, proxy):
            await test(url, ps, ds, proxy)

    asyncio.run(main())


def test_concurrent_requests_spread_over_the_workers() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        for stand in ps + ds:
            stand.delay = 0.05
        answers = await asyncio.gather(*(post(url, chat(i)) for i in range(16)))
        assert all(status == 200 for status, _, _ in answers)
        assert all(len(s.calls) >= 4 for s in ds)  # least outstanding: shared
        assert sum(len(s.calls) for s in ps) == 16 and all(s.calls for s in ps)
        assert all(m.outstanding == 0 for m in proxy.fleet)

    run(test)


def test_one_images_requests_stay_on_one_prefill_while_its_load_allows() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        for _ in range(6):  # one after another: the key's prefill is never over the bound
            assert (await post(url, chat(1)))[0] == 200
        assert sorted(len(s.calls) for s in ps) == [0, 6]

    run(test)


def test_a_worker_failure_before_any_byte_is_retried_on_another_worker() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        ds[0].fail_next = [503]  # the first decode the tie goes to
        status, answer, _ = await post(url, chat())
        assert status == 200 and answer["object"] == "chat.completion"
        # The first decode answered 503; the retry went to the other, from the prefill on.
        assert [len(s.calls) for s in ds] == [1, 1]
        assert sum(len(s.calls) for s in ps) == 2
        metrics = proxy.metrics.render(proxy.fleet).decode()
        assert 'pd_policy_retries_total{leg="decode"} 1.0' in metrics
        # Both failing: the request fails with the worker's 503, after two attempts.
        for stand in ds:
            stand.fail_next = [503]
        status, answer, _ = await post(url, chat())
        assert status == 503 and answer["error"]["code"] == "decode_worker_failed_to_start"

    run(test)


def test_no_retry_for_a_workers_400_nor_after_the_client_has_seen_output() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        for stand in ds:
            stand.fail_next = [400]
        status, answer, _ = await post(url, chat())
        assert status == 400 and answer["error"]["code"] == "decode_worker_failed_to_start"
        assert sum(len(s.calls) for s in ds) == 1
        for stand in ds:
            # The other decode's 400 is not left pending: a retry would reach it.
            stand.fail_next, stand.cut_stream = [], True
        # One connection for two requests: the proxy reads the second only once it is done
        # with the first, so whatever the first's handler did after the client saw its
        # end is counted before the second begins.
        prefilled = sum(len(s.calls) for s in ps)
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.post(f"{url}/v1/chat/completions", json=chat(stream=True)) as r:
                status, text = r.status, await r.text()
            assert status == 200 and '"worker"' in text and "decode_stream_error" in text
            async with session.post(f"{url}/v1/chat/completions", json=chat()) as r:
                assert r.status == 200, await r.text()
        # The cut stream was not tried again, nor even planned again (a new attempt's
        # prefill would run for a client that has had its answer).
        assert sum(len(s.calls) for s in ps) == prefilled + 2
        assert sum(len(s.calls) for s in ds) == 3
        retried = proxy.metrics.registry.get_sample_value("pd_policy_retries_total",
                                                          {"leg": "decode"})  # fmt: skip
        assert not retried

    run(test)


def test_a_worker_refusing_the_routers_key_is_a_bad_gateway_never_a_401() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        # The client is admitted; the router's key is what a worker refused.
        ds[0].fail_next = [401]
        status, answer, _ = await post(url, chat())
        assert status == 200 and [len(s.calls) for s in ds] == [1, 1]  # retried elsewhere
        for stand in ds:
            stand.fail_next = [403]
        status, answer, _ = await post(url, chat())
        assert status == 502 and answer["error"]["code"] == "decode_worker_failed_to_start"
        assert "credentials" in answer["error"]["message"]

    run(test)


def test_failures_in_a_row_eject_a_worker_and_the_probe_brings_it_back_as_what_it_is() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        sick = ds[0]
        sick.fail_next = [503] * 10
        for i in range(4):  # each fails over to the other decode
            assert (await post(url, chat(i)))[0] == 200
        member = proxy.fleet.find(sick.url)
        assert member is not None and member.health.health is Health.EJECTED
        calls = len(sick.calls)
        for i in range(3):
            assert (await post(url, chat(i)))[0] == 200
        assert len(sick.calls) == calls  # ejected: not tried
        # It comes back as a vision worker: the probe describes it anew.
        sick.fail_next, sick.lm_only = [], False
        for _ in range(40):
            await asyncio.sleep(0.1)
            if health(member) is Health.HEALTHY:
                break
        assert health(member) is Health.HEALTHY
        assert not member.worker.capability.language_model_only
        assert "pd_policy_ejections_total" in proxy.metrics.render(proxy.fleet).decode()

    run(test, probe=Probe(interval=0.05, redescribe=0.05))


def health(member: Member) -> Health:
    return member.health.health


def test_a_probe_that_fails_ejects_and_every_member_down_is_a_retryable_503() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        for stand in ds:
            stand.healthy = False
        for _ in range(40):
            await asyncio.sleep(0.05)
            if all(m.health.health is Health.EJECTED for m in proxy.fleet.of("decode")):
                break
        status, answer, _ = await post(url, chat())
        assert status == 503 and answer["error"]["code"] == "no_decode_worker_available"
        assert not any(s.calls for s in ds)

    run(test, probe=Probe(interval=0.05))


def test_keys_a_client_without_one_is_a_401_and_no_worker_is_called() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        for key in (None, "wrong", "client-secret-2x"):
            status, answer, text = await post(url, chat(), key)
            assert status == 401 and answer["error"]["code"] == "pd_unauthorized"
            assert "client-secret" not in text and "worker-secret" not in text
        assert not any(s.calls for s in ps + ds)
        status, _, _ = await post(url, chat(), "client-secret")
        assert status == 200
        legs = [c for s in ps + ds for c in s.calls]
        assert legs and all(c["authorization"] == "Bearer worker-secret" for c in legs)
        metrics = proxy.metrics.render(proxy.fleet).decode()
        assert "secret" not in metrics

    run(test, keys=Keys("worker-secret", ("client-secret",)))


def test_with_keys_metrics_are_for_the_clients_and_the_admins_only() -> None:
    # /metrics names every worker's address: not for a caller the proxy would not admit.
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        statuses = {}
        async with aiohttp.ClientSession() as session:
            for key in (None, "wrong", "worker-secret", "client-secret", "admin-secret"):
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                async with session.get(f"{url}/metrics", headers=headers) as r:
                    statuses[key] = (r.status, "pd_policy_worker_up" in await r.text())
        assert statuses == {None: (401, False), "wrong": (401, False),
                            "worker-secret": (401, False), "client-secret": (200, True),
                            "admin-secret": (200, True)}  # fmt: skip

    run(test, keys=Keys("worker-secret", ("client-secret",), ("admin-secret",)))


def test_metrics_count_requests_by_form_and_outcome_and_show_each_member() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        await post(url, chat())
        await post(url, {**chat(), "n": 2})  # refused: n>1 with an image on LM-only decode
        async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as r:
            text = await r.text()
        assert 'form="text_plus_hashes",outcome="ok",route="/v1/chat/completions"' in text
        assert 'outcome="pd_decode_language_model_only_n_samples"' in text
        for stand in ds:
            assert f'pd_policy_worker_up{{role="decode",worker="{stand.url}"}} 1.0' in text
        assert "pd_policy_ttft_seconds_count" in text and "pd_policy_decode_leg_bytes" in text

    run(test)


def test_the_admin_routes_add_list_and_drain_members() -> None:
    async def test(url: str, ps: list[Stand], ds: list[Stand], proxy: Proxy) -> None:
        leaving = ds[0]
        # The API takes no key here; the admin routes still take the admin's only.
        async with aiohttp.ClientSession() as anonymous, anonymous.get(f"{url}/admin/workers") as r:
            assert r.status == 403
        admin = {"Authorization": "Bearer admin-secret"}
        async with aiohttp.ClientSession(headers=admin) as session:
            async with session.delete(f"{url}/admin/workers", json={"url": leaving.url}) as r:
                assert r.status == 202
            for i in range(3):
                assert (await post(url, chat(i)))[0] == 200
            assert not leaving.calls  # draining: no new request
            async with session.post(f"{url}/admin/workers",
                                    json={"role": "decode", "url": leaving.url}) as r:  # fmt: skip
                assert r.status == 201
            async with session.get(f"{url}/admin/workers") as r:
                listed = (await r.json())["workers"]
        assert {w["role"] for w in listed} == {"prefill", "decode"}
        assert all(w["health"] == "healthy" for w in listed)
        assert all("url" not in w for w in listed)

    run(test, admin=True, keys=Keys(admins=("admin-secret",)))


def test_an_ipv6_fleet_behind_an_ipv6_proxy() -> None:
    async def main() -> None:
        def make(fleet: Fleet) -> Proxy:
            return Proxy(fleet=fleet, mrope=False)

        async with stands(1, 1, make, host="::1") as (url, ps, ds, proxy):
            assert url.startswith("http://[::1]:")
            status, _, _ = await post(url, chat())
            assert status == 200 and ps[0].calls and ds[0].calls
            assert all(m.name.startswith("http://[::1]:") for m in proxy.fleet)

    asyncio.run(main())


def test_flags_name_an_ipv6_fleet_whole_and_mooncake_bootstraps_on_its_literal() -> None:
    async def main() -> None:
        prefill, decode = Stand("p", lm_only=False, connector="MooncakeConnector"), Stand("d")
        async with serving(prefill.app(), "::1") as p_url, serving(decode.app(), "::1") as d_url:
            args = parser().parse_args(["--prefill", p_url, "--decode", d_url, "--no-mrope",
                                        "--host", "[::1]"])  # fmt: skip
            assert args.host == "::1"  # as written in a URL, bound as the address
            fleet = await read_fleet(args)
        (p,), (d,) = fleet.of("prefill"), fleet.of("decode")
        port = p_url.rsplit(":", 1)[1]
        assert p.name == f"http://[::1]:{port}" and d.name == d_url
        assert p.worker.kv.bootstrap_host == "::1"
        assert p.worker.kv.bootstrap_addr == "http://[::1]:8998"
        assert d.worker.capability.language_model_only

    asyncio.run(main())


def test_the_decode_capability_flag_speaks_of_decode_workers_only() -> None:
    # Neither worker describes itself: the flags say what they are. --decode-capability
    # lm-only must not make the prefill a language model only (it would refuse images).
    async def main() -> None:
        prefill, decode = Stand("p", describes=False), Stand("d", describes=False)
        async with serving(prefill.app()) as p_url, serving(decode.app()) as d_url:
            args = parser().parse_args(
                [
                    "--prefill",
                    p_url,
                    "--decode",
                    d_url,
                    "--no-mrope",
                    "--kv-mode",
                    "nixl",
                    "--decode-capability",
                    "lm-only",
                ]
            )
            fleet = await read_fleet(args)
        (p,), (d,) = fleet.of("prefill"), fleet.of("decode")
        assert d.worker.capability.language_model_only
        assert not p.worker.capability.language_model_only

    asyncio.run(main())


@pytest.mark.parametrize(
    ("role", "takes_metadata"),
    [("kv_consumer", True), ("kv_both", True), ("kv_producer", False), (None, False)],
)
def test_every_kv_role_a_worker_reports_counts(role: str | None, takes_metadata: bool) -> None:
    # A language-model-only worker that takes KV (a consumer, or both ways) takes M-RoPE
    # metadata; one that only produces KV, or takes none, does not.
    kv = {"kv_connector": "NixlConnector", "kv_role": role} if role else {}
    # What vLLM 0.32 reports of a language-model-only worker: embeddings-only items, and
    # items without embeddings, allowed; only the KV role differs.
    mm = {"language_model_only": True, "enable_mm_embeds": True,
          "allow_missing_mm_embeddings": True}  # fmt: skip
    config = {"model_config": {"multimodal_config": mm}, "kv_transfer_config": kv}
    capability = capability_from_config(config)
    assert capability.language_model_only
    assert capability.takes_mm_metadata is takes_metadata


@pytest.mark.parametrize("shared", [True, False])
def test_the_plan_names_items_under_the_chosen_prefills_own_settings(shared: bool) -> None:
    # Routing makes the core request once; the plan may take it only when it was made
    # under the chosen prefill's media settings (a hash factor of every item). Prefills
    # with settings of their own must each name an image under their own.
    fleet = Fleet()
    for i, port in enumerate((1, 2)):
        media = WorkerMedia(processor_kwargs={"num_crops": 4 if shared else i})
        worker = HttpWorker(f"http://127.0.0.1:{port}", WorkerCapability(Support.TRUE),
                            media=media)  # fmt: skip
        fleet.add("prefill", worker, healthy=True)
    fleet.add("decode", HttpWorker("http://127.0.0.1:3", WorkerCapability(Support.FALSE)),
              healthy=True)  # fmt: skip
    # No remote media: the plan fetches nothing, and needs no session.
    planning = Planning(False, None, MediaLimits(), None)  # type: ignore[arg-type]
    for seed in range(8):
        body = chat(seed)
        placer = HttpPlacer(fleet, body, Route.CHAT, mrope=False, request_id="r")
        placement = placer(())
        chosen = placer.chosen
        assert chosen is not None and chosen.placement is placement
        assert (chosen.request is not None) is shared and (placer.media is not None) is shared
        incoming = Incoming("r", Route.CHAT, Route.CHAT.value, body, None, False)
        plan = asyncio.run(planning.plan(incoming, chosen))
        own = policy_request(body, Route.CHAT, request_id="r", mrope=False,
                             media=placement.prefill.worker.media)  # fmt: skip
        assert plan.request.batches[0].mm_hashes == own.batches[0].mm_hashes

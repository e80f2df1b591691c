"""Client uuids through the proxy, against stand-in workers: what every leg carries.

The attack: tenant y sends tenant x's uuid (or what x's uuid was forwarded as) with
another image. vLLM keys its caches by the uuid a leg carries, so no leg may carry a
name that two tenants share: every uuid a client sends is scoped to its tenant (its
``cache_salt`` and the key the proxy admitted) before any leg is built, the spliced
prefill leg included. (The real workers' answers are in
``tests/vllm/http/test_http_llava_media_live.py``.)
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, Final

import aiohttp
import pytest
from aiohttp import web

from pd_policy import (
    ClientUuids,
    KvConnectorMode,
    PrefillKv,
    Support,
    Tenant,
    WorkerCapability,
    forwarded_uuid,
)
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.flags import client_uuids, parser
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.identity import WorkerMedia, part_identities
from pd_policy_vllm.openai.media.parts import media_parts
from pd_policy_vllm.openai.media.tenant import request_tenant, scope_uuids
from pd_policy_vllm.openai.wire.skim import SKIM_LEAST

UUID = "client-uuid-7f3a"
KEYS = Keys(None, ("key-x", "key-y"))

#: A handoff with every field NIXL needs: the proxy takes no less for a stripped leg.
NIXL_HANDOFF: Final = {"do_remote_prefill": True, "remote_engine_id": "e", "remote_block_ids": [0],
                       "remote_host": "127.0.0.1", "remote_port": 1}  # fmt: skip


def image(fill: bytes) -> str:
    # Long enough to be left in the client's bytes and spliced into the prefill leg.
    return "data:image/png;base64," + base64.b64encode(fill * SKIM_LEAST).decode()


def part(url: str | None, uuid: Any = UUID) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url} if url else None, "uuid": uuid}


def chat(*parts: dict[str, Any], salt: str | None = None) -> dict[str, Any]:
    content = [*parts, {"type": "text", "text": "?"}]
    body: dict[str, Any] = {"model": "m", "max_tokens": 2,
                            "messages": [{"role": "user", "content": content}]}  # fmt: skip
    if salt is not None:
        body["cache_salt"] = salt
    return body


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _run(
    sends: list[tuple[str, dict[str, Any]]], *, vision: bool, mode: ClientUuids,
    route: str = "/v1/chat/completions",
) -> tuple[list[int], list[bytes], list[Any]]:  # fmt: skip
    """Send each (key, body) through a proxy with a NIXL prefill and one decode (a vision
    one, or a language-model-only one): the statuses, the prefill legs' bytes as the
    worker received them, and the decode legs."""
    prefills: list[bytes] = []
    decodes: list[Any] = []

    async def prefill(request: web.Request) -> web.Response:
        prefills.append(await request.read())
        return web.json_response(
            {"prompt_token_ids": [1, 2, 3], "kv_transfer_params": NIXL_HANDOFF}
        )

    async def decode(request: web.Request) -> web.Response:
        decodes.append(await request.json())
        return web.json_response({"choices": []})

    runners = []
    try:
        urls = []
        for handler in (prefill, decode):
            app = web.Application(client_max_size=2**24)
            app.router.add_post("/v1/chat/completions", handler)
            app.router.add_post("/v1/responses", handler)
            runner, url = await _serve(app)
            runners.append(runner)
            urls.append(url)
        support = Support.TRUE if vision else Support.FALSE
        proxy = Proxy(
            HttpWorker(urls[0], kv=PrefillKv(KvConnectorMode.NIXL), media=WorkerMedia()),
            [HttpWorker(urls[1], WorkerCapability(support))],
            mrope=False, keys=KEYS, client_uuids=mode,
        )  # fmt: skip
        runner, proxy_url = await _serve(proxy.app())
        runners.append(runner)
        statuses = []
        async with aiohttp.ClientSession() as session:
            for key, body in sends:
                headers = {"Authorization": f"Bearer {key}"}
                url = proxy_url + route
                async with session.post(url, json=body, headers=headers) as r:
                    statuses.append(r.status)
        return statuses, prefills, decodes
    finally:
        for runner in runners:
            await runner.cleanup()


def _uuids(leg: Any) -> list[Any]:
    return [p.get("uuid") for p in leg["messages"][0]["content"] if "uuid" in p]


def _prefill_uuids(raw: bytes) -> list[Any]:
    return _uuids(json.loads(raw))


A, B = image(b"A"), image(b"B")
X, Y = Tenant.of(cache_salt="sx", api_key="key-x"), Tenant.of(cache_salt="sy", api_key="key-y")


def test_no_leg_carries_a_uuid_two_tenants_share() -> None:
    forged = forwarded_uuid(UUID, X)  # y read what x's uuid was forwarded as
    sends = [
        ("key-x", chat(part(A), salt="sx")),
        ("key-y", chat(part(B), salt="sy")),  # x's uuid, another image
        ("key-x", chat(part(A), salt="sx")),  # x again: the same name, the cache hits
        ("key-x", chat(part(None), salt="sx")),  # x names its item by the uuid alone
        ("key-y", chat(part(B, forged), salt="sy")),
        ("key-y", chat(part(B), salt="sx")),  # y with x's salt, but y's key
    ]
    statuses, prefills, decodes = asyncio.run(_run(sends, vision=True, mode=ClientUuids.SCOPED))
    assert statuses == [200] * len(sends)
    sent = [_prefill_uuids(raw) for raw in prefills]
    yx = Tenant.of(cache_salt="sx", api_key="key-y")
    assert sent == [[forwarded_uuid(UUID, X)], [forwarded_uuid(UUID, Y)],
                    [forwarded_uuid(UUID, X)], [forwarded_uuid(UUID, X)],
                    [forwarded_uuid(forged, Y)], [forwarded_uuid(UUID, yx)]]  # fmt: skip
    assert len({s[0] for s in sent[:2] + sent[4:]}) == 4
    # The client's uuid reaches no worker: not in the spliced prefill bytes, not on decode.
    assert all(UUID.encode() not in raw for raw in prefills)
    assert [_uuids(leg) for leg in decodes] == sent


def test_a_stripped_decode_leg_shares_no_salt_across_keys() -> None:
    # No cache_salt: the key alone is the tenant. The decode worker tells items apart only
    # by the salt the identities are folded into; two keys' one uuid are two items.
    sends = [("key-x", chat(part(A))), ("key-y", chat(part(B))), ("key-x", chat(part(A)))]
    statuses, _, decodes = asyncio.run(_run(sends, vision=False, mode=ClientUuids.SCOPED))
    assert statuses == [200] * 3
    salts = [leg["cache_salt"] for leg in decodes]
    assert salts[0] == salts[2] != salts[1]


def test_trusted_uuids_are_forwarded_as_sent() -> None:
    sends = [("key-x", chat(part(A), salt="sx")), ("key-y", chat(part(B), salt="sy"))]
    statuses, prefills, decodes = asyncio.run(_run(sends, vision=True, mode=ClientUuids.TRUSTED))
    assert statuses == [200, 200]
    assert [_prefill_uuids(raw) for raw in prefills] == [[UUID], [UUID]]
    assert [_uuids(leg) for leg in decodes] == [[UUID], [UUID]]


def test_a_responses_requests_own_decode_leg_carries_scoped_uuids() -> None:
    # The Responses API's decode leg on a vision decode is the client's own request: its
    # input's uuids are scoped as a chat body's messages are.
    item = {"role": "user", "content": [part(A), {"type": "input_text", "text": "?"}]}
    sends = [(key, {"model": "m", "input": [item], "cache_salt": salt})
             for key, salt in (("key-x", "sx"), ("key-y", "sy"))]  # fmt: skip
    statuses, prefills, decodes = asyncio.run(
        _run(sends, vision=True, mode=ClientUuids.SCOPED, route="/v1/responses")
    )
    assert statuses == [200, 200]
    want = [[forwarded_uuid(UUID, X)], [forwarded_uuid(UUID, Y)]]
    assert [_prefill_uuids(raw) for raw in prefills] == want
    assert [[p.get("uuid") for p in leg["input"][0]["content"] if "uuid" in p]
            for leg in decodes] == want  # fmt: skip


def test_every_parts_uuid_is_scoped_and_the_body_is_not_changed() -> None:
    text = {"type": "text", "text": "t", "uuid": "u-text"}  # vLLM ignores it; scoped anyway
    odd = {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}, "uuid": 7}
    body = {"messages": [{"role": "system", "content": "s"},
                         {"role": "user", "content": [text, part(A, "u-a"), odd,
                                                      part(A, None)]}]}  # fmt: skip
    before = repr(body)
    scoped = scope_uuids(body, X)
    assert repr(body) == before
    got = [p.get("uuid") for p in scoped["messages"][1]["content"]]
    assert got == [forwarded_uuid("u-text", X), forwarded_uuid("u-a", X),
                   forwarded_uuid("7", X), None]  # fmt: skip
    assert scoped["messages"][0] is body["messages"][0]
    plain = chat(part(A, None))
    assert scope_uuids(plain, X) is plain  # nothing to scope: the same body, spliced as sent
    assert scope_uuids(body, X, ClientUuids.TRUSTED) is body
    not_chats: list[Any] = [
        [],
        {"prompt": "p"},
        {"messages": "m"},
        {"messages": [1, {"content": 2}]},
    ]
    for not_chat in not_chats:
        assert scope_uuids(not_chat, X) is not_chat


def test_the_tenant_is_the_salt_and_the_admitted_key() -> None:
    bearer = "Bearer key-x"
    assert request_tenant({"cache_salt": "sx"}, bearer, keyed=True) == X
    assert request_tenant({}, "bearer  key-x ", keyed=True) == Tenant.of(api_key="key-x")
    # A proxy that takes any client admits no key: a bearer then names no one.
    assert request_tenant({"cache_salt": "sx"}, bearer, keyed=False) == Tenant.of(cache_salt="sx")
    assert request_tenant({}, None, keyed=True) == Tenant.of()
    assert request_tenant({"cache_salt": 3}, "Basic a2V5", keyed=True) == Tenant.of()


def test_scoped_identities_split_tenants_and_content_splits_images() -> None:
    def identities(body: dict[str, Any], tenant: Tenant) -> tuple[str, ...]:
        scoped = scope_uuids(body, tenant)
        return part_identities(scoped, media_parts(scoped), WorkerMedia(), nonce="n")

    x_a, y_b = identities(chat(part(A)), X), identities(chat(part(B)), Y)
    assert x_a != y_b and x_a == identities(chat(part(A)), X)
    assert identities(chat(part(A)), Y) != x_a  # the same bytes too: y's name is y's
    # Without a uuid an item is its bytes: two images are never one identity.
    assert identities(chat(part(A, None)), X) != identities(chat(part(B, None)), X)


def test_uuids_are_scoped_unless_the_operator_trusts_them() -> None:
    argv = ["--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2"]
    assert client_uuids(parser().parse_args(argv)) is ClientUuids.SCOPED
    trusted = parser().parse_args([*argv, "--trust-client-uuids"])
    assert client_uuids(trusted) is ClientUuids.TRUSTED


def test_a_body_with_no_uuid_costs_no_tenant_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    # Most bodies have no uuid: the tenant's digests are not the hot path's to pay.
    from pd_policy_vllm.openai.media import tenant as module

    made: list[object] = []

    def counted(*args: object, **kwargs: object) -> Tenant:
        made.append(args)
        return X

    monkeypatch.setattr(module, "request_tenant", counted)
    plain = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
    scoped = module.scoped_body(plain, b"{}", "Bearer key-x", keyed=True, mode=ClientUuids.SCOPED)
    assert scoped == (plain, b"{}")
    assert made == []
    part = {"type": "image_url", "image_url": {"url": "data:,"}, "uuid": "u"}
    named = {"messages": [{"role": "user", "content": [part, part]}]}
    _, raw = module.scoped_body(named, b"{}", "Bearer key-x", keyed=True, mode=ClientUuids.SCOPED)
    assert raw is None and len(made) == 1  # once for the body, however many uuids

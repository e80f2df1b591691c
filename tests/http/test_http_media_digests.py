"""A request's large media items are hashed in a worker thread, once, and the plan finds the
digest on the item itself: never a digest of other bytes.

The attack: one client's 100 MiB image (or audio clip, or the remote item the proxy
fetched for it) was hashed on the proxy's event loop, holding every other client's
requests while it ran. Now the front door hashes a request's inline items in a thread
when together they hold 1 MiB or more (SHA-256 releases the GIL), and the pin hashes
what it fetched there too. The digest is memoized on the item (a ``DataUrl``, a
``Canonical``), which cannot change: the tests below hold the identities to those
computed on the loop, and show that other bytes behind the same URL text, or the same
head, are another item.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import threading
from typing import Any

import aiohttp
import pytest
from fleet_stands import stands
from media_stands import chat, media_proxy, post

from pd_policy import MalformedRequest, MediaFetchRules
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.digests import HASH_OFF_LOOP, hashing
from pd_policy_vllm.openai.media.identity import WorkerMedia, part_identities
from pd_policy_vllm.openai.media.parts import media_parts
from pd_policy_vllm.openai.wire import codec, data_url
from pd_policy_vllm.openai.wire.codec import Canonical, dumps, loads, sha256_identity
from pd_policy_vllm.openai.wire.data_url import DataUrl
from pd_policy_vllm.openai.wire.skim import skim

BIG = HASH_OFF_LOOP + 1024


def data(size: int, fill: bytes = b"\x01") -> str:
    return "data:image/png;base64," + base64.b64encode(fill * (size * 3 // 4)).decode()


class Hashes:
    """Every SHA-256 over at least 1 MiB computed while installed, by thread."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def sha256(self, value: Any = b"") -> Any:
        if len(value) >= HASH_OFF_LOOP:
            self.threads.append(threading.get_ident())
        return hashlib.sha256(value)


@pytest.fixture
def hashes(monkeypatch: pytest.MonkeyPatch) -> Hashes:
    seen = Hashes()

    class Module:
        sha256 = staticmethod(seen.sha256)

    for module in (data_url, codec):
        monkeypatch.setattr(module, "hashlib", Module)
    from pd_policy_vllm.openai.media import identity

    monkeypatch.setattr(identity, "hashlib", Module)
    return seen


def _served(path: str, raw: bytes) -> int:
    async def main() -> int:
        def make(fleet: Fleet) -> Proxy:
            return Proxy(fleet=fleet, mrope=False, log_requests=False)

        headers = {"Content-Type": "application/json"}
        async with (
            stands(1, 1, make) as (url, _, _, _),
            aiohttp.ClientSession() as session,
            session.post(url + path, data=raw, headers=headers) as response,
        ):
            await response.read()
            return response.status

    return asyncio.run(main())


def _image_chat(url: str) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "?"}]
    return {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def _raw(body: Any) -> bytes:
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("path", "raw"),
    [
        ("/v1/chat/completions", _raw(_image_chat(data(BIG)))),
        # A client whose JSON escapes "/" (PHP's does): the URL is parsed, a str.
        ("/v1/chat/completions", _raw(_image_chat(data(BIG, b"\xff"))).replace(b"/", b"\\/")),
        ("/v1/chat/completions", _raw({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "input_audio", "input_audio": {"data": "UklG" * (BIG // 4), "format": "wav"}}
        ]}]})),
        ("/v1/responses", _raw({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": data(BIG)}]}]})),
    ],
    ids=["chat", "chat-escaped", "input-audio", "responses"],
)  # fmt: skip
def test_a_large_item_is_hashed_once_and_off_the_loop(
    hashes: Hashes, path: str, raw: bytes
) -> None:
    status = _served(path, raw)
    assert status in (200, 404)  # 404: the stand-in serves no Responses decode
    assert len(hashes.threads) == 1, hashes.threads  # once, for the plan, the legs, all
    assert hashes.threads[0] != threading.get_ident()  # not the event loop's


def test_a_fetched_item_is_hashed_once_and_off_the_loop(hashes: Hashes) -> None:
    async def main() -> None:
        rules = MediaFetchRules(allowed_domains=["localhost"], known=True)
        async with media_proxy([rules]) as served:
            status, _ = await post(served.url, chat(served.media + f"/big/{BIG}"))
            assert status == 200

    asyncio.run(main())
    assert len(hashes.threads) == 1 and hashes.threads[0] != threading.get_ident()


def test_small_items_are_not_handed_to_a_thread() -> None:
    assert hashing(_image_chat(data(HASH_OFF_LOOP // 2))) is None
    assert hashing(_image_chat("http://example.com/a.png")) is None  # not hashed at all
    assert hashing([1]) is None


def _bodies() -> list[dict[str, Any]]:
    audio = {"type": "input_audio", "input_audio": {"data": "UklG" * 300_000, "format": "wav"}}
    embeds = {"type": "image_embeds", "image_embeds": "AAAA" * 300_000}
    named = {"type": "image_url", "image_url": {"url": data(BIG)}, "uuid": "u"}
    remote = {"type": "image_url", "image_url": "http://example.com/a.png"}
    return [
        _image_chat(data(BIG)),
        {"messages": [{"role": "user", "content": [audio, embeds, named, remote]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": data(BIG)},
                                                   {"type": "text", "text": "a"}]}]},
    ]  # fmt: skip


@pytest.mark.parametrize("body", _bodies())
@pytest.mark.parametrize("skimmed", [False, True])
def test_the_identities_are_those_of_the_items_hashed_on_the_loop(
    body: dict[str, Any], skimmed: bool
) -> None:
    raw = json.dumps(body).encode()
    media = WorkerMedia()
    reference = skim(raw) if skimmed else loads(raw)
    before = part_identities(reference, media_parts(reference), media, nonce="n")
    body = skim(raw) if skimmed else loads(raw)  # its items not hashed yet
    work = hashing(body)
    assert work is not None
    hashed = work()
    assert part_identities(hashed, media_parts(hashed), media, nonce="n") == before
    # And every leg writes the same value.
    assert loads(dumps(hashed)) == loads(dumps(body))


def test_the_digest_is_the_items_own_never_one_of_other_bytes() -> None:
    one, other = data(BIG, b"\x01"), data(BIG, b"\x02")
    first, second = DataUrl.of(one), DataUrl.of(other)
    assert first is not None and second is not None
    assert first.head() == second.head() and len(first) == len(second)
    assert first.sha256() == hashlib.sha256(one.encode()).hexdigest()
    assert second.sha256() == hashlib.sha256(other.encode()).hexdigest() != first.sha256()
    # The same text in another body: the same item.
    raw = json.dumps(_image_chat(one)).encode()
    assert skim(raw)["messages"][0]["content"][0]["image_url"]["url"].sha256() == first.sha256()


def test_the_same_url_text_with_other_bytes_behind_it_is_another_item() -> None:
    # A remote URL fetched for two requests: new bytes, so another identity (a digest
    # kept by the URL's text would name the first request's image).
    async def main() -> list[str]:
        rules = MediaFetchRules(allowed_domains=["localhost"], known=True)
        async with media_proxy([rules]) as served:
            for _ in range(2):
                status, _ = await post(served.url, chat(served.media + "/frame"))
                assert status == 200
            return [c["body"]["cache_salt"] for c in served.decodes[0].calls]

    salts = asyncio.run(main())
    assert len(salts) == 2 and salts[0] != salts[1]


@pytest.mark.parametrize("text", ["data:é,AAAA", 'data:"x', "data:\\x", "data:\n,AAAA"])
def test_a_large_data_url_that_is_not_base64_text_is_refused(text: str) -> None:
    assert DataUrl.of(text) is None
    work = hashing(_image_chat(text + "A" * BIG))
    assert work is not None
    with pytest.raises(MalformedRequest) as refused:
        work()
    assert refused.value.status == 400 and refused.value.param == "messages[0].content[0]"


def test_a_canonical_item_is_its_values_canonical_json() -> None:
    value = {"format": "wav", "data": "UklG", "rate": 1.5}
    held = Canonical(value)
    assert held.json == codec.canonical(value)
    assert held.digest == sha256_identity(value) == sha256_identity(held)
    assert loads(dumps({"a": held})) == {"a": value}
    codec.USE_MSGSPEC, was = False, codec.USE_MSGSPEC
    try:
        assert loads(dumps({"a": held})) == {"a": value}
        assert codec.canonical({"a": held}) == codec.canonical({"a": value})
    finally:
        codec.USE_MSGSPEC = was

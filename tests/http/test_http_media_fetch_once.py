"""A remote item is fetched once per client request, whatever its attempts, and each
attempt's prefill's own rules still apply to it; a request's fetches together are
bounded.

The attack on the first: the proxy fetched a request's remote items again on every
attempt (twice with the default ``--attempts 2``), so a retried request read the media
host twice, and its second prefill could see other bytes than its first (a URL is a
name, not content). Now an item is fetched on the first attempt that needs it, kept for
the request, and every later attempt's legs carry the same bytes; but a retry on a
prefill with stricter rules (allowed domains, redirects, size) refuses what that
prefill's own fetch would have refused. And since items times the per-item cap could be
gigabytes, a request's fetches together read at most three quarters of the body cap.
Against a real aiohttp media host on 127.0.0.1 and stand-in workers.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from media_stands import Served, chat, media_proxy, post

from pd_policy import MediaFetchRules
from pd_policy_vllm.http.front_door import FrontDoor

BOTH = ["localhost", "127.0.0.1"]


def rules(domains: list[str] = BOTH, **more: Any) -> MediaFetchRules:
    return MediaFetchRules(allowed_domains=domains, known=True, **more)


def _image(call: dict[str, Any]) -> bytes:
    url: str = call["body"]["messages"][0]["content"][0]["image_url"]["url"]
    return base64.b64decode(url.partition(",")[2])


def _first_fails_then_second(served: Served) -> None:
    # The first prefill leg fails (503, retryable), whichever prefill takes it; the
    # second prefill is busier, so the first attempt goes to the first.
    fail = [503]
    served.prefills[0].fail_next = served.prefills[1].fail_next = fail
    served.proxy.fleet.of("prefill")[1].outstanding = 10


def test_a_retried_request_fetches_its_media_once_and_sends_the_same_bytes() -> None:
    async def main() -> None:
        async with media_proxy([rules(), rules()]) as served:
            _first_fails_then_second(served)
            status, answer = await post(served.url, chat(served.media + "/frame"))
            assert status == 200, answer
            assert [a["path"] for a in served.host.asked] == ["/frame"]
            (first,), (second,) = served.prefills[0].calls, served.prefills[1].calls
            assert _image(first) == _image(second) == b"frame 1"

    asyncio.run(main())


def test_each_request_fetches_anew() -> None:
    async def main() -> None:
        async with media_proxy([rules()]) as served:
            for _ in range(2):
                status, _ = await post(served.url, chat(served.media + "/frame"))
                assert status == 200
            assert [a["path"] for a in served.host.asked] == ["/frame", "/frame"]
            assert [_image(c) for c in served.prefills[0].calls] == [b"frame 1", b"frame 2"]

    asyncio.run(main())


def _retried_on(second: MediaFetchRules, path: str) -> tuple[int, Any, Served]:
    async def main() -> tuple[int, Any, Served]:
        async with media_proxy([rules(), second]) as served:
            _first_fails_then_second(served)
            status, answer = await post(served.url, chat(served.media.replace(
                "localhost", "127.0.0.1") + path))  # fmt: skip
            return status, answer, served

    return asyncio.run(main())


def test_a_retry_refuses_a_redirect_to_a_host_its_prefill_does_not_allow() -> None:
    status, answer, served = _retried_on(rules(["127.0.0.1"]), "/to-localhost")
    assert (status, answer["error"]["code"]) == (400, "pd_media_refused")
    assert len(served.prefills[0].calls) == 1 and served.prefills[1].calls == []


def test_a_retry_refuses_a_redirect_when_its_prefill_follows_none() -> None:
    status, answer, served = _retried_on(rules(allow_redirects=False), "/to-frame")
    assert (status, answer["error"]["code"]) == (422, "pd_media_fetch_failed")
    assert served.prefills[1].calls == []


def test_a_retry_refuses_an_item_larger_than_its_prefill_takes() -> None:
    status, answer, served = _retried_on(rules(max_download_bytes=100), "/big/500")
    assert (status, answer["error"]["code"]) == (422, "pd_media_fetch_failed")
    assert served.prefills[1].calls == []


def test_a_retry_on_a_prefill_that_takes_the_item_is_served() -> None:
    status, _, served = _retried_on(rules(max_download_bytes=1000), "/big/500")
    assert status == 200 and len(served.prefills[1].calls) == 1
    assert len(served.host.asked) == 1


def test_a_requests_fetches_together_are_bounded_by_the_body_cap() -> None:
    # A body cap of 1600 bytes: the items' base64 no larger, so 1200 bytes of items.
    async def main() -> None:
        async with media_proxy([rules()], door=FrontDoor(max_body=1600)) as served:
            big = served.media + "/big/500"
            status, answer = await post(served.url, chat(big, big, big))
            assert (status, answer["error"]["code"]) == (422, "pd_media_fetch_failed")
            assert "together" in answer["error"]["message"]
            assert served.prefills[0].calls == []
            status, _ = await post(served.url, chat(big, big))
            assert status == 200

    asyncio.run(main())

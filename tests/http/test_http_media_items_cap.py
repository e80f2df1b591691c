"""A request's media items are capped at the front door, before any per-item work.

The attack: one body of hundreds of thousands of tiny ``data:`` images, well within the
body cap. Every item would be planned, hashed, scoped to its tenant and placed on the
proxy's one event loop, holding every other client (``GET /health`` included) for
seconds. So the door counts a request's items (cheaply: it stops at the cap and one) and
refuses past ``--max-media-items`` with a 400 ``pd_too_many_media_items``, before its
uuids are scoped, its items read or any worker called; on the chat route and on the
Responses API's input alike.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from fleet_stands import stands

from pd_policy import forwarded_uuid
from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS
from pd_policy_vllm.http.flags import front_door, parser
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.front_door import FrontDoor
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media import tenant
from pd_policy_vllm.openai.media.parts import count_media_items

IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
CAP = 4


def chat(*parts: dict[str, Any]) -> dict[str, Any]:
    content = [*parts, {"type": "text", "text": "?"}]
    return {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}


def responses(count: int) -> dict[str, Any]:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    content = [*([image] * count), {"type": "input_text", "text": "?"}]
    return {"model": "m", "max_output_tokens": 2,
            "input": [{"role": "user", "content": content}]}  # fmt: skip


async def _post(url: str, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(url + path, json=body) as r:
        return r.status, json.loads(await r.read())


def through_proxy(path: str, body: Any, door: FrontDoor) -> tuple[int, dict[str, Any], int]:
    """``body`` sent on ``path`` to a proxy with ``door`` over stand-in workers: the
    status, the answer and how many legs the workers received."""

    async def main() -> tuple[int, dict[str, Any], int]:
        def make(fleet: Fleet) -> Proxy:
            return Proxy(fleet=fleet, mrope=False, log_requests=False, front_door=door)

        async with stands(1, 1, make) as (url, prefills, decodes, _):
            status, answer = await _post(url, path, body)
            return status, answer, len(prefills[0].calls) + len(decodes[0].calls)

    return asyncio.run(main())


def _refused(status: int, answer: dict[str, Any], legs: int) -> None:
    assert (status, answer["error"]["code"], legs) == (400, "pd_too_many_media_items", 0)
    assert answer["error"]["param"] == "messages"


def test_a_chat_request_past_the_cap_is_refused_before_any_worker() -> None:
    door = FrontDoor(max_media_items=CAP)
    _refused(*through_proxy("/v1/chat/completions", chat(*[IMAGE] * (CAP + 1)), door))
    status, _, legs = through_proxy("/v1/chat/completions", chat(*[IMAGE] * CAP), door)
    assert (status, legs) == (200, 2)  # at the cap: served


def test_a_responses_request_past_the_cap_is_refused_before_any_worker() -> None:
    _refused(*through_proxy("/v1/responses", responses(CAP + 1), FrontDoor(max_media_items=CAP)))


def test_the_default_cap_is_the_cores() -> None:
    assert FrontDoor().max_media_items == DEFAULT_MAX_MEDIA_ITEMS
    flood = chat(*[IMAGE] * (DEFAULT_MAX_MEDIA_ITEMS + 1))
    _refused(*through_proxy("/v1/chat/completions", flood, FrontDoor()))


def test_no_uuid_of_a_refused_request_is_scoped(monkeypatch: pytest.MonkeyPatch) -> None:
    # Scoping hashes each uuid with the tenant: per-item work, after the count.
    scoped: list[str] = []
    real = forwarded_uuid

    def counting(uuid: str, *args: Any) -> str:
        scoped.append(uuid)
        return real(uuid, *args)

    monkeypatch.setattr(tenant, "forwarded_uuid", counting)
    named = [{**IMAGE, "uuid": f"u{i}"} for i in range(CAP + 1)]
    _refused(*through_proxy("/v1/chat/completions", chat(*named), FrontDoor(max_media_items=CAP)))
    assert scoped == []
    status, _, _ = through_proxy("/v1/chat/completions", chat(*named[:CAP]), FrontDoor())
    assert status == 200 and len(scoped) == CAP  # the guard sees scoping when it runs


def test_a_text_part_with_a_uuid_counts_it_is_scoped_too() -> None:
    named_text = [{"type": "text", "text": "a", "uuid": f"u{i}"} for i in range(CAP + 1)]
    door = FrontDoor(max_media_items=CAP)
    _refused(*through_proxy("/v1/chat/completions", chat(*named_text), door))


class Counted(list[Any]):
    """A list that counts the items read from it."""

    read = 0

    def __iter__(self) -> Iterator[Any]:
        for item in super().__iter__():
            Counted.read += 1
            yield item


@pytest.mark.parametrize("field", ["messages", "input"])
def test_the_count_stops_at_the_cap_and_one(field: str) -> None:
    Counted.read = 0
    content = Counted([IMAGE] * 10_000)
    body = {field: Counted([{"role": "user", "content": content}] * 10)}
    assert count_media_items(body, CAP + 1) == CAP + 1
    assert Counted.read <= CAP + 2  # the one message, and the parts up to the cap and one


def test_the_count_is_of_media_and_named_parts_only() -> None:
    text = {"type": "text", "text": "a"}
    body = {"messages": [{"role": "user", "content": [IMAGE, text, 7, {**text, "uuid": 1}]},
                         {"role": "user", "content": "plain"}, "not a message"],
            "input": [{"content": [{"type": "input_image", "image_url": "x"}]}]}  # fmt: skip
    assert count_media_items(body, 100) == 3
    assert count_media_items([IMAGE], 100) == 0  # not an object: the plan refuses it


def test_the_flag_sets_the_cap() -> None:
    args = parser().parse_args(["--prefill", "http://p", "--decode", "http://d"])
    assert front_door(args).max_media_items == DEFAULT_MAX_MEDIA_ITEMS
    args = parser().parse_args(
        ["--prefill", "http://p", "--decode", "http://d", "--max-media-items", "7"]
    )
    assert front_door(args).max_media_items == 7
    with pytest.raises(SystemExit):
        parser().parse_args(["--prefill", "p", "--decode", "d", "--max-media-items", "0"])

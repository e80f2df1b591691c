"""One request's messages and content parts are capped, and a large body's parse and splice run
off the event loop.

The attack (measured by ``bench/fairness.py``): a 12 MiB body of 400 000 text parts, each
a step of Python in the parse, the counts, the walks over a request's parts on every
attempt and the splice of its prefill leg, held ``/health`` for more than a second a
request, and no cap counted text parts. Now the front door refuses a request of more
than ``--max-content-parts`` messages and parts (400 ``pd_too_many_parts``) before any
part is read, and parses and counts a body of 1 MiB or more in a thread, as the send
splices its prefill leg: the loop answers everyone else meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import aiohttp
import pytest
from fleet_stands import stands

from pd_policy_vllm.http import parsing, send
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.front_door import FrontDoor
from pd_policy_vllm.http.parsing import OFF_THE_LOOP
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.media.parts import count_parts

TEXT = {"type": "text", "text": "a"}


def chat(parts: int, messages: int = 1) -> dict[str, Any]:
    each = [{"role": "user", "content": [TEXT] * parts} for _ in range(messages)]
    return {"model": "m", "max_tokens": 4, "messages": each}


def responses(parts: int) -> dict[str, Any]:
    text = {"type": "input_text", "text": "a"}
    return {"model": "m", "input": [{"role": "user", "content": [text] * parts}]}


async def _post(
    path: str, body: dict[str, Any], door: FrontDoor
) -> tuple[int, dict[str, Any], int]:
    def make(fleet: Fleet) -> Proxy:
        return Proxy(fleet=fleet, mrope=False, log_requests=False, front_door=door)

    async with (
        stands(1, 1, make) as (url, prefills, decodes, _),
        aiohttp.ClientSession() as session,
        session.post(url + path, json=body) as response,
    ):
        answer = await response.json()
        return response.status, answer, len(prefills[0].calls) + len(decodes[0].calls)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat(10)),  # one message and its ten parts: eleven
        ("/v1/chat/completions", chat(1, messages=6)),  # six messages, six parts: twelve
        ("/v1/responses", responses(10)),
    ],
)
def test_more_messages_and_parts_than_the_cap_are_refused_before_any_worker(
    path: str, body: dict[str, Any]
) -> None:
    status, answer, calls = asyncio.run(_post(path, body, FrontDoor(max_parts=10)))
    assert (status, answer["error"]["code"], calls) == (400, "pd_too_many_parts", 0)
    assert answer["error"]["param"] == "messages"


def test_a_request_at_the_cap_is_served() -> None:
    status, _, calls = asyncio.run(_post("/v1/chat/completions", chat(9), FrontDoor(max_parts=10)))
    assert (status, calls) == (200, 2)


def test_the_flood_of_text_parts_is_refused_at_the_default_cap() -> None:
    status, answer, calls = asyncio.run(_post("/v1/chat/completions", chat(20_000), FrontDoor()))
    assert (status, answer["error"]["code"], calls) == (400, "pd_too_many_parts", 0)


def test_parts_are_counted_by_their_lists_up_to_the_most_and_no_further() -> None:
    assert count_parts(chat(3, messages=2), 100) == 8
    assert count_parts(responses(4), 100) == 5
    assert count_parts(chat(1, messages=1000), 10) == 10  # stops at the most
    assert count_parts({"messages": "hi", "input": [3, {"content": "x"}]}, 100) == 2
    assert count_parts([], 100) == 0


class Threads:
    """The threads a watched function ran on."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def watch(self, fn: Any) -> Any:
        def watched(*args: Any, **kwargs: Any) -> Any:
            self.seen.append(threading.get_ident())
            return fn(*args, **kwargs)

        return watched


@pytest.mark.parametrize(("size", "off"), [(OFF_THE_LOOP + 1, True), (OFF_THE_LOOP // 2, False)])
def test_a_large_body_is_parsed_and_spliced_off_the_loop(
    monkeypatch: pytest.MonkeyPatch, size: int, off: bool
) -> None:
    parses, splices = Threads(), Threads()
    monkeypatch.setattr(parsing, "skim", parses.watch(vars(parsing)["skim"]))
    monkeypatch.setattr(send, "prefill_bytes", splices.watch(vars(send)["prefill_bytes"]))
    body = {**chat(1), "padding": "x" * size}
    loop_thread: list[int] = []

    async def main() -> int:
        loop_thread.append(threading.get_ident())
        status, answer, _ = await _post("/v1/chat/completions", body, FrontDoor())
        assert status == 200, answer
        return status

    asyncio.run(main())
    assert len(parses.seen) == 1 and len(splices.seen) == 1
    assert (parses.seen[0] != loop_thread[0]) is off
    assert (splices.seen[0] != loop_thread[0]) is off


def test_the_flood_costs_the_loop_no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    # The refusal of a large flood is decided in the thread too: the loop never counts it.
    counted = Threads()
    monkeypatch.setattr(parsing, "count_parts", counted.watch(vars(parsing)["count_parts"]))
    loop_thread: list[int] = []
    flood = chat(200_000)
    assert len(json.dumps(flood)) > OFF_THE_LOOP

    async def main() -> None:
        loop_thread.append(threading.get_ident())
        status, answer, _ = await _post("/v1/chat/completions", flood, FrontDoor())
        assert (status, answer["error"]["code"]) == (400, "pd_too_many_parts")

    asyncio.run(main())
    assert counted.seen and all(t != loop_thread[0] for t in counted.seen)

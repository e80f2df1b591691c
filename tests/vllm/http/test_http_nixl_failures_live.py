"""A failed transfer on vLLM's own ``NixlConnector``, through the proxy: never a 200.

Three ``vllm serve`` workers of the tiny LLaVA, started once for this module on 127.0.0.1
and stopped by process id: a full-vision prefill (``kv_producer``, a lease of ``LEASE``
seconds on each request's KV: ``kv_connector_extra_config.kv_lease_duration``), which also
answers as a full server when sent a plain request; a ``--language-model-only`` decode that
fails a request whose KV load failed (vLLM's default, ``kv_load_failure_policy`` ``fail``);
and one that recomputes it (``recompute``). A relay between the proxies and the prefill
(``prefill_relay``) stands in for the network: it holds the prefill's answers back, or
kills the prefill once it has answered. The last test kills it: the module's prefill is
destroyed, and nothing after that test uses it.

- The recomputing decode is never sent a stripped image leg: alone, an image request is
  refused (``pd_decode_blind_to_media``) and text is served there over NIXL; beside the
  failing decode, images go to that one.
- A prefill's answer held past its lease is not relayed: the decode would read blocks the
  prefill freed (vLLM 0.32 reads them without an error and answers 200, run by hand and
  written in ``docs/wires.md``). A 502 ``pd_kv_lease_expired``; the prefill's NIXL
  metrics count the expired lease; no decode gets a leg.
- A prefill killed after answering: the decode's NIXL read fails (its NIXL metrics count
  it), vLLM fails the request, and the client gets the decode's typed 500, whole or
  streamed, tried again nowhere (the only other decode recomputes: it may not take the
  image). The recomputing decode, sent the same stripped leg by hand, answers 200
  image-blind: what the proxy never lets happen.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import attrs
import pytest
from http_peers import data_url, http_json, proxy, read_fleet
from llava_prompts import TEXT
from nixl_peers import NixlCounters, nixl_counters, nixl_server
from prefill_relay import PrefillRelay
from router_side import image
from servers import Server, running
from tiny_models import TinyModel

from pd_policy import KvConnectorMode
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure

#: The prefill's lease on a request's KV, in seconds: a decode leg needs 5 s of it left,
#: so the prefill answers in time when it takes under 15 s, on two busy cores.
LEASE: Final = 20


@attrs.frozen
class Peers:
    """The module's workers, the relay in front of the prefill, and two proxies through it:
    ``blind`` over the recomputing decode alone, ``both`` over both decodes."""

    prefill: Server
    failing: Server
    recomputing: Server
    relay: PrefillRelay
    blind: str
    both: str


@pytest.fixture(scope="module")
def peers(llava: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peers]:
    logs = tmp_path_factory.mktemp("nixl-failures")
    lease = {"kv_connector_extra_config": {"kv_lease_duration": LEASE}}
    p = nixl_server("prefill", llava, logs, "kv_producer", limits={"image": 1}, kv=lease)
    fail = nixl_server("failing", llava, logs, "kv_consumer", language_model_only=True)
    again = {"kv_load_failure_policy": "recompute"}
    rec = nixl_server("recomputing", llava, logs, "kv_consumer", language_model_only=True,
                      kv=again)  # fmt: skip
    with contextlib.ExitStack() as stack:
        stack.enter_context(running([p, fail, rec]))
        relay = stack.enter_context(PrefillRelay(p))
        blind = proxy(_dir(logs, "blind"), relay.url, [rec.url], "--no-mrope")
        both = proxy(_dir(logs, "both"), relay.url, [fail.url, rec.url], "--no-mrope")
        stack.enter_context(running([blind, both]))
        yield Peers(p, fail, rec, relay, blind.url, both.url)


def _dir(root: Path, name: str) -> Path:
    (root / name).mkdir(exist_ok=True)
    return root / name


def body(seed: int | None, variant: str, **extra: Any) -> dict[str, Any]:
    """A chat request: the image ``seed`` (none: text only), then the text."""
    content: list[Any] = [{"type": "text", "text": f"{variant} {TEXT}"}]
    if seed is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": data_url(image(seed))}})
    return {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, "temperature": 0, "return_token_ids": True, **extra}  # fmt: skip


def tokens(url: str, request: dict[str, Any]) -> list[int]:
    status, reply = http_json(f"{url}/v1/chat/completions", request, timeout=120)
    assert status == 200, reply
    ids: list[int] = reply["choices"][0]["token_ids"]
    return ids


def sent(url: str, request: dict[str, Any]) -> tuple[int, Any]:
    """The status and JSON of ``request`` through the proxy at ``url``: a whole answer's
    body, or for a stream that was refused its error body (a stream that began is
    returned as its raw text, with its 200)."""
    if not request.get("stream"):
        return http_json(f"{url}/v1/chat/completions", request, timeout=180)
    call = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(request).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(call, timeout=180) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def together(url: str, requests: list[dict[str, Any]]) -> list[tuple[int, Any]]:
    """``requests`` sent through the proxy at ``url`` at once."""
    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(lambda r: sent(url, r), requests))


def counters(*servers: Server) -> list[NixlCounters]:
    return [nixl_counters(s.url) for s in servers]


def test_the_proxy_reads_each_decodes_failure_policy_and_the_prefills_lease(
    peers: Peers,
) -> None:
    prefill, decodes = read_fleet("--prefill", peers.relay.url, "--decode",
                                  peers.failing.url, "--decode", peers.recomputing.url)  # fmt: skip
    assert prefill.kv.mode is KvConnectorMode.NIXL and prefill.kv.lease == LEASE
    failing, recomputing = (d.capability for d in decodes)
    assert failing.decode_kv == DecodeKv(KvLoad.BY_REQUEST, LoadFailure.FAIL)
    assert recomputing.decode_kv == DecodeKv(KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE)
    assert recomputing.blind_to_stripped_media and not failing.blind_to_stripped_media


def test_a_recomputing_decode_alone_gets_no_image_and_serves_text_over_nixl(
    peers: Peers,
) -> None:
    before = counters(peers.prefill, peers.recomputing)
    legs = len(peers.relay.answers)
    status, reply = http_json(f"{peers.blind}/v1/chat/completions", body(1, "rc-image"))
    assert status == 400 and reply["error"]["code"] == "pd_decode_blind_to_media"
    assert len(peers.relay.answers) == legs  # refused before any leg
    assert counters(peers.prefill, peers.recomputing) == before
    expected = tokens(peers.prefill.url, body(None, "rc-text"))
    assert tokens(peers.blind, body(None, "rc-text")) == expected
    moved = nixl_counters(peers.recomputing.url) - before[1]
    assert moved.transfers >= 1 and moved.bytes > 0 and moved.failed == 0


def test_images_go_to_the_decode_that_fails_a_failed_load(peers: Peers) -> None:
    expected = tokens(peers.prefill.url, body(2, "both-image"))
    before = counters(peers.failing, peers.recomputing)
    for _ in range(2):
        assert tokens(peers.both, body(2, "both-image")) == expected
    failing, recomputing = (a - b for a, b in zip(counters(peers.failing, peers.recomputing),
                                                  before, strict=True))  # fmt: skip
    assert failing.transfers >= 2 and failing.failed == 0
    assert recomputing == NixlCounters(0, 0, 0, 0)  # never a stripped image leg


def test_a_prefill_answer_past_its_lease_is_a_typed_502_and_no_decode_leg(
    peers: Peers,
) -> None:
    before = counters(peers.prefill, peers.failing, peers.recomputing)
    peers.relay.hold = LEASE + 1.0  # each answer reaches the proxy after the lease ran out
    try:
        answers = together(peers.both, [body(3, "late"), body(3, "late-stream", stream=True)])
    finally:
        peers.relay.hold = 0.0
    for status, reply in answers:
        assert status == 502, reply
        assert reply["error"]["code"] == "pd_kv_lease_expired"
    # The prefill released both requests' KV when their lease ran out; no decode read it.
    deadline = time.monotonic() + 30
    while nixl_counters(peers.prefill.url).expired - before[0].expired < 2:
        assert time.monotonic() < deadline, "the prefill did not release the expired KV"
        time.sleep(0.5)
    assert counters(peers.failing, peers.recomputing) == before[1:]


def test_a_prefill_killed_after_answering_is_a_typed_error_never_a_200(peers: Peers) -> None:
    # The last test: the prefill dies here.
    requests = [body(4, "killed"), body(4, "killed-stream", stream=True)]
    # The full server's answers, by prompt (while it lives).
    expected = {}
    for request in requests:
        status, reply = http_json(f"{peers.prefill.url}/v1/chat/completions",
                                  {**request, "stream": False}, timeout=120)  # fmt: skip
        assert status == 200, reply
        expected[tuple(reply["prompt_token_ids"])] = reply["choices"][0]["token_ids"]
    before = counters(peers.failing, peers.recomputing)
    peers.relay.arm_kill(after=2)  # the prefill dies once it has answered both
    answers = together(peers.both, requests)
    assert not peers.prefill.alive()
    for status, reply in answers:
        assert status == 500, reply  # typed, whole or streamed: never a 200
        assert reply["error"]["code"] == "decode_worker_failed_to_start"
    failing, recomputing = (a - b for a, b in zip(counters(peers.failing, peers.recomputing),
                                                  before, strict=True))  # fmt: skip
    assert failing.failed >= 2 and failing.transfers == 0  # each read of the dead prefill
    assert recomputing == NixlCounters(0, 0, 0, 0)  # the retry never gave it the image
    # What the proxy prevents: the same stripped leg, by hand, on the recomputing decode.
    leg = peers.relay.answers[-1]
    stripped = {"model": "tiny", "prompt": leg["prompt_token_ids"], "max_tokens": 8,
                "temperature": 0, "return_token_ids": True, "cache_salt": "by-hand",
                "kv_transfer_params": leg["kv_transfer_params"]}  # fmt: skip
    status, reply = http_json(f"{peers.recomputing.url}/v1/completions", stripped, timeout=120)
    assert status == 200, reply  # recomputed without the image
    assert reply["choices"][0]["token_ids"] != expected[tuple(leg["prompt_token_ids"])]
    assert (nixl_counters(peers.recomputing.url) - before[1]).failed >= 1

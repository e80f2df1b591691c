"""E/P/D with the tiny Qwen2-VL over HTTP: the pixels stop at the encoder.

The Qwen2-VL fleet's real ``vllm serve`` workers (``qwen_http``, see [`epd_peers`][]):
the encoder renders and encodes; the prefill, a cache consumer, gets each image's
grid metadata, the encoder's hashes and parameters, and no pixel; the
``--language-model-only`` decode gets the grid and the KV. Tokens and
log-probabilities must equal one full-vision server's, for images A, B, A.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from epd_peers import EncoderStandIn, EpdFleet, answer, chat_body, epd_fleet
from http_fleets import HttpFleet
from http_peers import InProcessProxy, fleet_args, http_json
from qwen_prompts import _WORDS, A, B

from pd_policy import EncoderCacheRole
from pd_policy_vllm.http.cli import read_encoder, read_workers
from pd_policy_vllm.openai.plan.scale_out import GENERATE, RENDER

IMAGES = {"A": A, "B": B}


@pytest.fixture(scope="module")
def fleet(qwen_http: HttpFleet) -> Iterator[EpdFleet]:
    with epd_fleet(qwen_http, mrope=True) as running:
        yield running


def body(name: str, variant: str) -> dict[str, Any]:
    words = " ".join([variant, *(_WORDS[(i * 7) % len(_WORDS)] for i in range(66))])
    return chat_body(IMAGES[name], words)


def test_the_proxy_reads_every_role_from_the_servers(fleet: EpdFleet) -> None:
    # The encoder and the prefill run vLLM's development mode (conftest's qwen_http): their
    # encoder-cache roles are read from /server_info; the decode, from its description.
    args = fleet_args("--prefill", fleet.prefill, "--decode", fleet.decode,
                      "--encode", fleet.encoder)  # fmt: skip
    prefill, (decode,) = asyncio.run(read_workers(args))
    encoder = asyncio.run(read_encoder(args, prefill))
    assert encoder is not None and encoder.capability.encoder_cache is EncoderCacheRole.PRODUCER
    assert prefill.capability.encoder_cache is EncoderCacheRole.CONSUMER
    assert decode.capability.takes_mm_metadata


def test_images_a_b_a_through_e_p_d_match_one_full_vision_server(fleet: EpdFleet) -> None:
    recording = fleet.proxy
    expected = {name: answer(fleet.baseline, body(name, "epd")) for name in IMAGES}
    assert expected["A"][1] != pytest.approx(expected["B"][1], abs=1e-4)  # else proves nothing
    for name in ("A", "B", "A"):
        before = len(recording.sent)
        tokens, logprobs = answer(recording.url, body(name, "epd"))
        assert tokens == expected[name][0]
        assert logprobs == pytest.approx(expected[name][1], abs=1e-5)
        legs = recording.sent[before:]
        assert [leg.url for leg in legs[:4]] == [
            fleet.encoder + RENDER, fleet.encoder + GENERATE, fleet.prefill + GENERATE,
            fleet.decode + GENERATE,
        ]  # fmt: skip
        encode, prefill, decode = (leg.body for leg in legs[1:4])
        # The pixels go to the encoder only.
        assert encode["features"]["kwargs_data"]["image"][0]
        assert "kwargs_data" not in prefill["features"]
        assert prefill["features"]["mm_metadata"] == encode["features"]["mm_metadata"]
        assert list(prefill["ec_transfer_params"]) == encode["features"]["mm_hashes"]["image"]
        grid = decode["features"]["kwargs_data"]["image"][0]
        assert len(grid) < 200 < 10_000 < len(encode["features"]["kwargs_data"]["image"][0])
        assert "image_url" not in json.dumps([leg.body for leg in legs[4:]])  # derender: none


def _drop_first(reply: dict[str, Any]) -> dict[str, Any]:
    params = dict(reply.get("ec_transfer_params") or {})
    params.pop(next(iter(params)))
    return {**reply, "ec_transfer_params": params}


def _rekey(reply: dict[str, Any]) -> dict[str, Any]:
    # Each item's output under another hash: the prefill would look up one the store lacks.
    params = reply.get("ec_transfer_params") or {}
    return {**reply, "ec_transfer_params": {f"{i:064x}": v for i, v in enumerate(params.values())}}


@pytest.mark.parametrize("edit", [_drop_first, _rekey], ids=["missing", "other-hash"])
def test_an_answer_that_misses_an_item_sends_no_prefill_and_every_server_lives(
    fleet: EpdFleet, edit: Any
) -> None:
    with EncoderStandIn(fleet.encoder, edit) as stand_in, InProcessProxy(
        fleet.proxy_with(stand_in.url)
    ) as recording:  # fmt: skip
        status, reply = http_json(f"{recording.url}/v1/chat/completions", body("B", "miss"))
        assert status == 502, reply
        assert reply["error"]["code"] == "pd_prefill_missing_encoder_output"
        assert recording.sent_to(fleet.prefill) == []  # the engine is never given the leg
        assert recording.sent_to(fleet.decode) == []
    # Every server still serves: the real chain answers as the baseline does.
    expected = answer(fleet.baseline, body("B", "after-miss"))
    assert answer(fleet.proxy.url, body("B", "after-miss"))[0] == expected[0]

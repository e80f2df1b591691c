"""E/P/D with the tiny LLaVA over HTTP: the image rides to the prefill, whose vision tower
is skipped.

LLaVA's processor publishes no metadata of an item without its pixels, so the
prefill leg keeps the image; the prefill, a cache consumer, loads the encoder's
output by hash instead of encoding it. The ``--language-model-only`` decode gets
the ids and the KV, as in P/D. Tokens and log-probabilities must equal one
full-vision server's, for images A, B, A.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from epd_peers import EpdFleet, answer, chat_body, epd_fleet
from http_fleets import HttpFleet
from http_peers import http_json
from llava_prompts import TEXT
from router_side import image

from pd_policy_vllm.http import Route
from pd_policy_vllm.openai.plan.scale_out import GENERATE, RENDER


@pytest.fixture(scope="module")
def fleet(llava_http: HttpFleet) -> Iterator[EpdFleet]:
    with epd_fleet(llava_http, mrope=False) as running:
        yield running


def body(seed: int, variant: str) -> dict[str, Any]:
    return chat_body(image(seed), f"{variant} {TEXT}")


def test_images_a_b_a_through_e_p_d_match_one_full_vision_server(fleet: EpdFleet) -> None:
    recording = fleet.proxy
    expected = {seed: answer(fleet.baseline, body(seed, "epd")) for seed in (1, 2)}
    assert expected[1] != expected[2]  # else matching them would prove nothing
    for seed in (1, 2, 1):
        before = len(recording.sent)
        tokens, logprobs = answer(recording.url, body(seed, "epd"))
        assert tokens == expected[seed][0]
        assert logprobs == pytest.approx(expected[seed][1], abs=1e-5)
        legs = recording.sent[before:]
        assert [leg.url for leg in legs] == [
            fleet.encoder + RENDER, fleet.encoder + GENERATE, fleet.prefill + GENERATE,
            fleet.decode + Route.CHAT.value,
        ]  # fmt: skip
        encode, prefill, decode = (leg.body for leg in legs[1:])
        # The image rides to the prefill with the encoder's parameters; decode gets none.
        pixels = encode["features"]["kwargs_data"]["image"][0]
        assert prefill["features"]["kwargs_data"]["image"][0] == pixels
        assert list(prefill["ec_transfer_params"]) == encode["features"]["mm_hashes"]["image"]
        assert "image_url" not in str(decode) and pixels not in str(decode)


def test_the_prefill_takes_each_encoding_from_the_store_not_its_tower(fleet: EpdFleet) -> None:
    # LLaVA's prefill leg carries the image, so matching tokens alone cannot tell whether
    # the prefill encoded it. Store B's encoding under a new hash, and send A's prefill leg
    # (A's pixels) naming that hash: a prefill that takes the store answers as B.
    recording = fleet.proxy
    legs = {}
    for seed in (1, 2):
        before = len(recording.sent)
        answer(recording.url, body(seed, "store"))
        legs[seed] = recording.sent[before + 2].body  # render, encode, prefill
    expected = {seed: answer(fleet.baseline, body(seed, "store"))[0] for seed in (1, 2)}
    assert expected[1] != expected[2]
    b_hash = legs[2]["features"]["mm_hashes"]["image"][0]
    fresh = uuid.uuid4().hex * 2  # in no engine's memory: the prefill must read the store
    shutil.copytree(fleet.store / b_hash, fleet.store / fresh)
    replay = {**legs[1], "kv_transfer_params": None, "cache_salt": fresh}
    replay["features"] = {**replay["features"], "mm_hashes": {"image": [fresh]}}
    replay["ec_transfer_params"] = {fresh: legs[2]["ec_transfer_params"][b_hash]}
    replay["sampling_params"] = {**replay["sampling_params"], "max_tokens": 6}
    status, reply = http_json(f"{fleet.prefill}/inference/v1/generate", replay)
    assert status == 200, reply
    assert reply["choices"][0]["token_ids"] == expected[2]  # B's, from A's pixels

"""The M-RoPE metadata path on vLLM's own ``NixlConnector``, against real servers.

Two ``vllm serve`` workers of the tiny Qwen2-VL (an M-RoPE model), both with
``--enable-scale-out`` and ``NixlConnector`` (KV in host memory), started once for this
module on 127.0.0.1 and stopped by process id: a full-vision prefill (``kv_producer``), which
also answers as a full server when sent a plain request, and a ``--language-model-only``
decode (``kv_consumer``) that takes the media's metadata. The proxy renders on the prefill,
prefills through ``/inference/v1/generate``, decodes there with each item's grid and no
pixels, and derenders; it reads NIXL and the metadata path from the configuration file that
describes the workers (neither runs vLLM's development mode) and the routes they serve.

Each transfer is proven by the decode's NIXL metrics.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
from epd_peers import answer
from http_peers import InProcessProxy, http_json, read_fleet
from nixl_peers import NixlPair, NixlPairs, Transfer
from test_http_qwen_media_live import body, same, video
from test_http_qwen_mrope_live import IMAGES, chat
from tiny_models import TinyModel

from pd_policy import KvConnectorMode
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.plan.scale_out import DERENDER, GENERATE, RENDER


@pytest.fixture(scope="module")
def pair(qwen2vl: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NixlPair]:
    root = tmp_path_factory.mktemp("nixl-qwen")
    pairs = NixlPairs(qwen2vl, root, limits={"image": 1, "video": 1},
                      extra=("--enable-scale-out",), proxy_flags=("--mrope",))  # fmt: skip
    with contextlib.closing(pairs):
        yield pairs.get("NixlConnector")


@pytest.fixture(scope="module")
def recording(pair: NixlPair) -> Iterator[InProcessProxy]:
    """The proxy in this process, as it reads the workers, recording the legs it sends."""
    prefill, (decode,) = read_fleet("--prefill", pair.prefill, "--decode", pair.decode)
    assert prefill.kv.mode is KvConnectorMode.NIXL  # its kv_transfer_config, no --kv-mode
    assert prefill.renders and decode.capability.takes_mm_metadata  # the metadata path
    with InProcessProxy(Proxy(prefill, [decode], mrope=True)) as live:
        yield live


def test_images_a_b_a_on_the_metadata_path_match_a_full_server(pair: NixlPair) -> None:
    expected = {name: chat(pair.baseline, name, "nixl-abA") for name in IMAGES}
    assert expected["A"] != expected["B"]  # else matching them would prove nothing
    for name in ("A", "B", "A"):
        with Transfer(pair):
            assert chat(pair.proxy, name, "nixl-abA") == expected[name]


def test_video_a_b_a_on_the_metadata_path_matches_a_full_server(
    pair: NixlPair, recording: InProcessProxy
) -> None:
    want = {seed: answer(pair.baseline, body([video(seed)], "nixl-video")) for seed in (1, 2)}
    assert want[1][0] != want[2][0]  # else matching them would prove nothing
    for seed in (1, 2, 1):
        before = len(recording.sent)
        with Transfer(pair):
            status, reply = http_json(
                f"{recording.url}/v1/chat/completions", body([video(seed)], "nixl-video")
            )
        assert status == 200, reply
        choice = reply["choices"][0]
        got = choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]
        assert same(got, want[seed])
        legs = recording.sent[before:]
        routes = [leg.url.removeprefix(pair.prefill).removeprefix(pair.decode) for leg in legs]
        assert routes == [RENDER, GENERATE, GENERATE, DERENDER]
        decode = legs[2].body
        assert len(decode["features"]["kwargs_data"]["video"][0]) < 200  # the grid alone
        assert decode["kv_transfer_params"]["remote_block_ids"]  # NIXL's handoff, relayed
        assert "video_url" not in json.dumps([decode, legs[3].body])

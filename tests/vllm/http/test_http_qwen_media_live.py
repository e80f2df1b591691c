"""Video, and new content at one URL, through the proxy on the Qwen2-VL fleet's real servers.

The fleet (``qwen_http``: the tiny Qwen2-VL, M-RoPE, image and video, every worker with
``--enable-scale-out``; started once on 127.0.0.1 for the Qwen2-VL modules, stopped by
process id). P/D is the metadata path: render on the prefill, a whole prefill through
generate, and a decode on the ``--language-model-only`` worker with each item's grid
(``video_grid_thw`` for a video), hash and placeholder, and no pixels. E/P/D renders
and encodes on the encoder, and the prefill takes the grid alone. Tokens and logprobs
must equal one full-vision server's.

The clips are made here (``media_clips``): four random 56x56 frames as an MPEG-4 file,
which the tiny model samples into a (2, 24, 24) grid and 288 placeholder ids.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
from epd_peers import EpdFleet, answer, epd_fleet
from http_fleets import HttpFleet
from http_peers import InProcessProxy, MediaHost, data_url, http_json, read_fleet
from media_clips import data_url_of, video_clip
from qwen_prompts import _WORDS, A, B

from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.plan.scale_out import DERENDER, GENERATE, RENDER

# The media host is on 127.0.0.1, which the proxy refuses by default.
LAB = MediaLimits(allow_private_hosts=True)

Answer = tuple[list[int], list[float]]
CLIPS = {seed: data_url_of(video_clip(seed), "video/mp4") for seed in (1, 2)}


@pytest.fixture(scope="module")
def metadata(qwen_http: HttpFleet) -> Iterator[InProcessProxy]:
    prefill, (decode,) = read_fleet("--prefill", qwen_http.prefill, "--decode", qwen_http.decode)
    assert prefill.renders and decode.capability.takes_mm_metadata
    proxy = Proxy(prefill, [decode], mrope=True, remote_media=RemoteMedia.FETCH, media_limits=LAB)
    with InProcessProxy(proxy) as recording:
        yield recording


@pytest.fixture(scope="module")
def epd(qwen_http: HttpFleet) -> Iterator[EpdFleet]:
    with epd_fleet(qwen_http, mrope=True) as fleet:
        yield fleet


@pytest.fixture(scope="module")
def host() -> Iterator[MediaHost]:
    with MediaHost() as media:
        yield media


def video(seed: int) -> dict[str, Any]:
    return {"type": "video_url", "video_url": {"url": CLIPS[seed]}}


def picture(which: Any) -> dict[str, Any]:
    url = which if isinstance(which, str) else data_url(which)
    return {"type": "image_url", "image_url": {"url": url}}


def body(parts: list[dict[str, Any]], variant: str) -> dict[str, Any]:
    words = " ".join([variant, *(_WORDS[(i * 7) % len(_WORDS)] for i in range(40))])
    content = [*parts, {"type": "text", "text": words}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 6,
            "temperature": 0, "logprobs": True, "return_token_ids": True}  # fmt: skip


def same(got: Answer, want: Answer) -> bool:
    return got[0] == want[0] and got[1] == pytest.approx(want[1], abs=1e-5)


def test_a_clip_expands_to_its_grid_of_frames(qwen_http: HttpFleet) -> None:
    status, rendered = http_json(qwen_http.prefill + RENDER, body([video(1)], "grid"))
    assert status == 200, rendered
    (place,) = rendered["features"]["mm_placeholders"]["video"]
    assert place["length"] == 288  # 2 x 24 x 24 patches, merged 2 x 2
    assert "image" not in rendered["features"]["mm_hashes"]


def test_video_a_b_a_through_p_d_matches_the_baseline_and_no_pixel_reaches_decode(
    metadata: InProcessProxy, qwen_http: HttpFleet
) -> None:
    want = {seed: answer(qwen_http.baseline, body([video(seed)], "video")) for seed in (1, 2)}
    assert want[1][0] != want[2][0]  # else matching them would prove nothing
    for seed in (1, 2, 1):
        before = len(metadata.sent)
        request = body([video(seed)], "video")
        status, reply = http_json(metadata.url + "/v1/chat/completions", request)
        assert status == 200, reply
        choice = reply["choices"][0]
        got = choice["token_ids"], [t["logprob"] for t in choice["logprobs"]["content"]]
        assert same(got, want[seed])
        status, plain = http_json(qwen_http.baseline + "/v1/chat/completions", request)
        assert reply["prompt_token_ids"] == plain["prompt_token_ids"]
        legs = metadata.sent[before:]
        routes = [leg.url.removeprefix(qwen_http.prefill).removeprefix(qwen_http.decode)
                  for leg in legs]  # fmt: skip
        assert routes == [RENDER, GENERATE, GENERATE, DERENDER]
        prefill, decode = legs[1].body, legs[2].body
        pixels = prefill["features"]["kwargs_data"]["video"][0]
        grid = decode["features"]["kwargs_data"]["video"][0]
        assert len(grid) < 200 < 100_000 < len(pixels)  # the grid alone, not the frames
        assert decode["features"]["mm_hashes"] == prefill["features"]["mm_hashes"]
        assert "video_url" not in json.dumps([decode, legs[3].body])


def test_an_image_and_a_video_in_one_request(
    metadata: InProcessProxy, qwen_http: HttpFleet
) -> None:
    for image, seed in ((A, 1), (B, 2), (A, 1)):
        request = body([picture(image), video(seed)], "both")
        assert same(answer(metadata.url, request), answer(qwen_http.baseline, request))
        decode = metadata.sent_to(qwen_http.decode)[-2].body  # then the derender
        assert set(decode["features"]["mm_hashes"]) == {"image", "video"}
        assert all(len(item) < 200 for items in decode["features"]["kwargs_data"].values()
                   for item in items)  # fmt: skip


def test_video_through_e_p_d_stops_the_pixels_at_the_encoder(epd: EpdFleet) -> None:
    recording = epd.proxy
    for seed in (2, 1, 2):
        request = body([video(seed)], "epd-video")
        before = len(recording.sent)
        assert same(answer(recording.url, request), answer(epd.baseline, request))
        legs = recording.sent[before:]
        assert [leg.url for leg in legs[:4]] == [
            epd.encoder + RENDER, epd.encoder + GENERATE, epd.prefill + GENERATE,
            epd.decode + GENERATE,
        ]  # fmt: skip
        encode, prefill, decode = (leg.body for leg in legs[1:4])
        assert len(encode["features"]["kwargs_data"]["video"][0]) > 100_000
        assert "kwargs_data" not in prefill["features"]  # the grid, in the metadata items
        assert list(prefill["ec_transfer_params"]) == encode["features"]["mm_hashes"]["video"]
        assert len(decode["features"]["kwargs_data"]["video"][0]) < 200


def png(which: Any) -> bytes:
    buffer = io.BytesIO()
    which.save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.mark.parametrize("path", ["metadata", "epd"])
def test_new_content_at_one_url_gets_the_new_contents_answer(
    path: str, request: pytest.FixtureRequest, host: MediaHost, qwen_http: HttpFleet
) -> None:
    # Both paths render first, on a worker that fetches the URL once and names the item by
    # the bytes it fetched; the later legs carry those bytes' hash, never the URL.
    url = (
        request.getfixturevalue(path).url
        if path == "metadata"
        else (request.getfixturevalue(path).proxy.url)
    )
    want = {name: answer(qwen_http.baseline, body([picture(image)], f"cam-{path}"))
            for name, image in (("A", A), ("B", B))}  # fmt: skip
    assert want["A"][0] != want["B"][0]
    for name, image in (("A", A), ("B", B), ("A", A)):
        served = host.serve(f"latest-{path}.png", png(image), "image/png")
        assert same(answer(url, body([picture(served)], f"cam-{path}")), want[name])

"""Audio through P/D onto a ``--language-model-only`` decode, against real ``vllm serve``.

The audio pair (``audio_http``: the tiny Qwen2-Audio built in the fixtures, a full prefill
that also answers the baseline and a ``--language-model-only`` decode on the
``TransferConnector``; started once on 127.0.0.1, stopped by process id). Qwen2-Audio
has no M-RoPE grid, so its decode leg is the stripped one: the prefill's expanded ids,
the relayed KV and the salt folded from each clip's identity, and no audio.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from epd_peers import answer
from http_fleets import PdFleet
from http_peers import InProcessProxy, MediaHost, read_fleet
from media_clips import audio_clip, data_url_of, input_audio

from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.media.guard import MediaLimits
from pd_policy_vllm.http.proxy import Proxy

# The media host is on 127.0.0.1, which the proxy refuses by default.
LAB = MediaLimits(allow_private_hosts=True)

Answer = tuple[list[int], list[float]]
CLIPS = {seed: audio_clip(seed) for seed in (1, 2)}


@pytest.fixture(scope="module")
def recording(audio_http: PdFleet) -> Iterator[InProcessProxy]:
    prefill, (decode,) = read_fleet("--prefill", audio_http.prefill, "--decode", audio_http.decode)
    assert decode.capability.language_model_only and prefill.media.rules.known
    proxy = Proxy(prefill, [decode], mrope=False, remote_media=RemoteMedia.FETCH, media_limits=LAB)
    with InProcessProxy(proxy) as live:
        yield live


@pytest.fixture(scope="module")
def host() -> Iterator[MediaHost]:
    with MediaHost() as media:
        yield media


def audio_url(url: str) -> dict[str, Any]:
    return {"type": "audio_url", "audio_url": {"url": url}}


def _inline(seed: int) -> dict[str, Any]:
    return input_audio(CLIPS[seed])


def _data_url(seed: int) -> dict[str, Any]:
    return audio_url(data_url_of(CLIPS[seed], "audio/wav"))


PARTS: dict[str, Callable[[int], dict[str, Any]]] = {"input_audio": _inline, "audio_url": _data_url}


def body(part: dict[str, Any], variant: str) -> dict[str, Any]:
    content = [part, {"type": "text", "text": f"{variant} what is this sound"}]
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 8,
            "temperature": 0, "logprobs": True, "return_token_ids": True}  # fmt: skip


def same(got: Answer, want: Answer) -> bool:
    return got[0] == want[0] and got[1] == pytest.approx(want[1], abs=1e-5)


@pytest.mark.parametrize("kind", sorted(PARTS))
def test_clips_a_b_a_through_p_d_match_the_full_server_and_no_audio_reaches_decode(
    kind: str, recording: InProcessProxy, audio_http: PdFleet
) -> None:
    want = {seed: answer(audio_http.baseline, body(PARTS[kind](seed), kind)) for seed in (1, 2)}
    assert want[1][0] != want[2][0]  # else matching them would prove nothing
    for seed in (1, 2, 1):
        assert same(answer(recording.url, body(PARTS[kind](seed), kind)), want[seed])
    decodes = [s.body for s in recording.sent_to(audio_http.decode)[-3:]]
    prefills = [s.body for s in recording.sent_to(audio_http.prefill)[-3:]]
    clips = [base64.b64encode(CLIPS[seed]).decode()[:200] for seed in (1, 2)]
    assert all(any(c in json.dumps(leg) for c in clips) for leg in prefills)
    for leg in decodes:
        parts = [p for m in leg["messages"] for p in m["content"] if isinstance(m["content"], list)]
        assert all(p["type"] == "text" for p in parts)
        assert not any(c in json.dumps(leg) for c in clips) and len(json.dumps(leg)) < 4_000
        assert len(leg["kv_transfer_params"]["prompt_token_ids"]) > 25  # a clip: 25 ids
    assert decodes[0]["cache_salt"] == decodes[2]["cache_salt"] != decodes[1]["cache_salt"]


def test_new_audio_at_one_url_gets_the_new_clips_answer(
    recording: InProcessProxy, host: MediaHost, audio_http: PdFleet
) -> None:
    want = {seed: answer(audio_http.baseline, body(PARTS["audio_url"](seed), "url"))
            for seed in (1, 2)}  # fmt: skip
    for seed in (2, 1, 2):
        url = host.serve("latest.wav", CLIPS[seed], "audio/wav")
        assert same(answer(recording.url, body(audio_url(url), "url")), want[seed])
    assert host.fetches["latest.wav"] == 3  # by the proxy, once a request

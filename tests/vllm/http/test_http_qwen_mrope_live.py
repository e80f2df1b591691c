"""The M-RoPE metadata path over HTTP, against real ``vllm serve`` workers.

Two servers of the Qwen2-VL fleet (``qwen_http``: the tiny Qwen2-VL, an M-RoPE
model, started once on 127.0.0.1 for the Qwen2-VL modules and stopped by process
id), both with ``--enable-scale-out`` and the ``TransferConnector``: a full-vision
prefill (KV producer), which also answers the baseline as a plain chat request,
and a ``--language-model-only`` decode (KV consumer). The proxy renders on the
prefill, prefills through generate, decodes with the images' grids and no pixels,
and derenders for the client.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import attrs
import openai
import pytest
from http_fleets import HttpFleet
from http_peers import (
    InProcessProxy,
    data_url,
    http_json,
    proxy,
    read_fleet,
    running_requests,
    wait_idle,
)
from qwen_prompts import _WORDS, A, B
from servers import running

from pd_policy import KvConnectorMode, PrefillKv, Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.openai.plan.scale_out import DERENDER, GENERATE, RENDER

#: The live servers hand KV over with pd-policy's TransferConnector.
TRANSFER_KV = PrefillKv(KvConnectorMode.TRANSFER)

QWEN_LIMITS = {"image": 1, "video": 0}
IMAGES = {"A": A, "B": B}


@attrs.frozen
class QwenFleet:
    prefill: str
    decode: str
    proxy: str


@pytest.fixture(scope="module")
def qwen_fleet(qwen_http: HttpFleet) -> Iterator[QwenFleet]:
    p_url, d_url = qwen_http.prefill, qwen_http.decode
    x = proxy(qwen_http.logs, p_url, [d_url], "--mrope")
    with running([x]):
        yield QwenFleet(p_url, d_url, x.url)


@pytest.fixture(scope="module")
def qwen_recording(qwen_fleet: QwenFleet) -> Iterator[InProcessProxy]:
    metadata = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
    live = Proxy(
        HttpWorker(qwen_fleet.prefill, renders=True, kv=TRANSFER_KV),
        [HttpWorker(qwen_fleet.decode, metadata, renders=True)],
        mrope=True,
    )
    with InProcessProxy(live) as recording:
        yield recording


def text(variant: str) -> str:
    # The measured prompt of qwen_prompts, as chat text: A and B answer differently.
    return " ".join([variant, *(_WORDS[(i * 7) % len(_WORDS)] for i in range(66))])


def messages(name: str, variant: str) -> list[dict[str, Any]]:
    picture = {"type": "image_url", "image_url": {"url": data_url(IMAGES[name])}}
    return [{"role": "user", "content": [picture, {"type": "text", "text": text(variant)}]}]


def body(name: str, variant: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages(name, variant), "max_tokens": 6,
            "temperature": 0, "return_token_ids": True, **extra}  # fmt: skip


def chat(url: str, name: str, variant: str, *, stream: bool = False) -> list[int]:
    """Greedy tokens through ``url`` with the openai client."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    kwargs: dict[str, Any] = {
        "model": "tiny", "messages": messages(name, variant), "max_tokens": 6, "temperature": 0,
        "extra_body": {"return_token_ids": True},
    }  # fmt: skip
    if not stream:
        reply = client.chat.completions.create(**kwargs).model_dump()
        tokens: list[int] = reply["choices"][0]["token_ids"]
        return tokens
    tokens = []
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        for choice in chunk.model_dump()["choices"]:
            tokens += choice.get("token_ids") or []
    return tokens


def test_the_proxy_learns_the_metadata_path_from_the_workers(qwen_fleet: QwenFleet) -> None:
    # The routes from the servers; the decode's capability from its description.
    prefill, (decode,) = read_fleet("--prefill", qwen_fleet.prefill, "--decode", qwen_fleet.decode)
    assert prefill.renders and decode.renders
    assert decode.capability.language_model_only and decode.capability.takes_mm_metadata


def test_images_a_b_a_through_the_proxy_match_the_baseline(qwen_fleet: QwenFleet) -> None:
    expected = {name: chat(qwen_fleet.prefill, name, "abA") for name in IMAGES}
    assert expected["A"] != expected["B"]  # else matching them would prove nothing
    for name in ("A", "B", "A"):
        assert chat(qwen_fleet.proxy, name, "abA") == expected[name]
    for name in ("B", "A"):
        assert chat(qwen_fleet.proxy, name, "abA-s", stream=True) == chat(
            qwen_fleet.prefill, name, "abA-s"
        )


def test_the_decode_leg_carries_grids_and_no_pixels(
    qwen_fleet: QwenFleet, qwen_recording: InProcessProxy
) -> None:
    reports = []
    for name in ("A", "B", "A"):
        status, reply = http_json(f"{qwen_recording.url}/v1/chat/completions", body(name, "legs"))
        assert status == 200 and reply["object"] == "chat.completion"
        assert reply["choices"][0]["token_ids"] == chat(qwen_fleet.prefill, name, "legs")
        reports.append(reply["kv_transfer_params"])
        # Render, then prefill, on the prefill server; generate, then derender, on decode.
        sent = qwen_recording.sent[-4:]
        routes = [s.url.removeprefix(qwen_fleet.prefill).removeprefix(qwen_fleet.decode)
                  for s in sent]  # fmt: skip
        assert routes == [RENDER, GENERATE, GENERATE, DERENDER]
        render = qwen_recording.sent_to(qwen_fleet.prefill)[-2]
        prefill_leg, decode_leg = sent[1].body, sent[2].body
        assert render.body["messages"][0]["content"][0]["type"] == "image_url"
        pixels = prefill_leg["features"]["kwargs_data"]["image"][0]
        grid = decode_leg["features"]["kwargs_data"]["image"][0]
        assert len(grid) < 200 < 10_000 < len(pixels)  # the grid alone, not the image
        assert decode_leg["token_ids"] == prefill_leg["token_ids"]
        assert decode_leg["kv_transfer_params"]["transfer_id"] == reply_transfer(reply)
        assert decode_leg["sampling_params"]["max_tokens"] == 6
        assert "image_url" not in json.dumps(sent[3].body)  # derender: no media either
    # The decode server's own cache: B gets nothing from A; A again gets A's blocks.
    assert [r["local_cached_tokens"] for r in reports] == [0, 0, reports[2]["local_cached_tokens"]]
    assert reports[2]["local_cached_tokens"] > 0
    assert all(r["loaded_tokens"] > 0 for r in reports[:2])


def reply_transfer(reply: dict[str, Any]) -> str:
    transfer: str = reply["kv_transfer_params"]["transfer_id"]
    return transfer


def logprobs_of(url: str, request: dict[str, Any]) -> list[float]:
    """The logprob of each generated token (greedy), as the server reports it."""
    status, reply = http_json(f"{url}/v1/chat/completions", {**request, "logprobs": True})
    assert status == 200, reply
    return [t["logprob"] for t in reply["choices"][0]["logprobs"]["content"]]


def test_without_the_grids_the_decode_answers_with_text_positions(
    qwen_fleet: QwenFleet,
) -> None:
    """Why an M-RoPE image is never sent down the stripped chat path: the decode server
    takes the forwarded ids and the KV and answers 200, but places the last prompt token
    and every output token at text positions, so its scores are not the image's."""
    for name in IMAGES:
        variant = f"positions-{name}"
        baseline = logprobs_of(qwen_fleet.prefill, body(name, variant))
        prefill = body(name, variant, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
        status, reply = http_json(f"{qwen_fleet.prefill}/v1/chat/completions", prefill)
        assert status == 200
        leg = body(name, variant, cache_salt=f"stripped-{name}")
        leg["messages"][0]["content"] = leg["messages"][0]["content"][1:]  # the text alone
        leg["kv_transfer_params"] = {
            **reply["kv_transfer_params"], "prompt_token_ids": reply["prompt_token_ids"]
        }  # fmt: skip
        stripped = logprobs_of(qwen_fleet.decode, leg)  # a 200: no error anywhere
        # Measured: the same request twice differs by 0.0; this leg by 3e-3 to 5e-3 (the
        # tiny model's random weights make the greedy tokens often agree regardless).
        assert max(abs(s - b) for s, b in zip(stripped, baseline, strict=True)) > 1e-3
        # Through the proxy (its metadata leg carries the grid), the scores are the image's.
        proxied = logprobs_of(qwen_fleet.proxy, body(name, variant))
        assert proxied == pytest.approx(baseline, abs=1e-5)


def test_without_scale_out_on_the_prefill_an_m_rope_image_is_refused_before_any_worker(
    qwen_fleet: QwenFleet,
) -> None:
    metadata = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
    live = Proxy(
        HttpWorker(qwen_fleet.prefill, renders=False, kv=TRANSFER_KV),
        [HttpWorker(qwen_fleet.decode, metadata, renders=True)],
        mrope=True,
    )
    with InProcessProxy(live) as recording:
        status, reply = http_json(f"{recording.url}/v1/chat/completions", body("A", "refused"))
        assert status == 400
        assert reply["error"]["code"] == "pd_decode_language_model_only_mrope"
        assert reply["error"]["param"] == "input_ids"
        status, reply = http_json(f"{recording.url}/v1/chat/completions", body("A", "refused", n=2))
        assert (status, reply["error"]["code"]) == (400, "pd_decode_language_model_only_n_samples")
        assert recording.sent == []


def test_a_client_that_disconnects_mid_stream_leaves_nothing_running(
    qwen_fleet: QwenFleet,
) -> None:
    request = urllib.request.Request(
        f"{qwen_fleet.proxy}/v1/chat/completions",
        data=json.dumps(body("B", "gone", max_tokens=900, ignore_eos=True, stream=True)).encode(),
        headers={"Content-Type": "application/json"},
    )
    response = urllib.request.urlopen(request, timeout=120)
    first = response.readline()
    assert first.startswith(b"data:") and b"chat.completion.chunk" in first  # derendered
    assert running_requests(qwen_fleet.decode) == 1
    response.close()  # the client goes away
    wait_idle(qwen_fleet.decode, qwen_fleet.prefill)

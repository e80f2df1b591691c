"""The proxy against real ``vllm serve`` workers, driven by the official ``openai`` client.

The LLaVA fleet's vLLM servers (``llava_http``: started once on 127.0.0.1 for the
LLaVA modules, stopped by process id): a full-vision prefill (KV producer), which
also answers the baseline as a plain chat request, and a ``--language-model-only``
decode (KV consumer) of the tiny LLaVA on the ``TransferConnector``, neither with
``--enable-scale-out``. Neither runs vLLM's development mode: the proxy reads them from
the configuration file that describes them as they were started. The proxy runs as
``pd-policy-proxy`` (a process), and, where a test reads the legs it sends, in this
process with a recording trace.
"""

from __future__ import annotations

import asyncio
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
    fleet_args,
    http_json,
    proxy,
    read_fleet,
    running_requests,
    wait_idle,
)
from llava_prompts import TEXT
from router_side import image
from servers import running

from pd_policy import KvConnectorMode, PrefillKv
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.cli import read_fleet as read_members
from pd_policy_vllm.http.proxy import Proxy


@attrs.frozen
class Fleet:
    prefill: str
    decode: str
    baseline: str
    proxy: str
    decode_worker: HttpWorker
    prefill_worker: HttpWorker


@pytest.fixture(scope="module")
def fleet(llava_http: HttpFleet) -> Iterator[Fleet]:
    p_url, d_url = llava_http.prefill, llava_http.decode
    x = proxy(llava_http.logs, p_url, [d_url], "--no-mrope")
    with running([x]):
        # Each worker as the proxy reads it, before its decode is fitted to its prefill.
        members = asyncio.run(read_members(fleet_args("--prefill", p_url, "--decode", d_url)))
        (decode,), (prefill,) = members.of("decode"), members.of("prefill")
        yield Fleet(p_url, d_url, llava_http.baseline, x.url, decode.worker, prefill.worker)


def messages(seed: int | None, variant: str) -> list[dict[str, Any]]:
    text = {"type": "text", "text": f"{variant} {TEXT}"}
    if seed is None:
        return [{"role": "user", "content": [text]}]
    picture = {"type": "image_url", "image_url": {"url": data_url(image(seed))}}
    return [{"role": "user", "content": [picture, text]}]


def chat_body(seed: int | None, variant: str, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages(seed, variant), "max_tokens": 8,
            "temperature": 0, "return_token_ids": True, **extra}  # fmt: skip


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def chat(url: str, seed: int | None, variant: str, *, stream: bool = False) -> list[int]:
    """The tokens of a greedy chat completion through ``url``, with the openai client."""
    kwargs: dict[str, Any] = {
        "model": "tiny", "messages": messages(seed, variant), "max_tokens": 8,
        "temperature": 0, "extra_body": {"return_token_ids": True},
    }  # fmt: skip
    if not stream:
        reply = client(url).chat.completions.create(**kwargs).model_dump()
        tokens: list[int] = reply["choices"][0]["token_ids"]
        return tokens
    tokens = []
    for chunk in client(url).chat.completions.create(stream=True, **kwargs):
        for choice in chunk.model_dump()["choices"]:
            tokens += choice.get("token_ids") or []
    return tokens


def test_the_proxy_reads_each_worker_from_its_description(fleet: Fleet) -> None:
    assert fleet.decode_worker.capability.language_model_only
    assert fleet.decode_worker.capability.takes_mm_metadata  # a KV consumer: 0.32 allows it
    assert fleet.prefill_worker.kv.mode is KvConnectorMode.TRANSFER  # the TransferConnector
    # As the proxy reads them at start-up: without --enable-scale-out there is no
    # metadata path, so the decode worker is served as plainly language-model-only.
    prefill, (decode,) = read_fleet("--prefill", fleet.prefill, "--decode", fleet.decode)
    assert not prefill.renders and not decode.renders
    assert decode.capability.language_model_only and not decode.capability.takes_mm_metadata
    assert prefill.kv == fleet.prefill_worker.kv
    status, models = http_json(f"{fleet.proxy}/v1/models")
    assert status == 200 and models["data"][0]["id"] == "tiny"


def test_images_a_b_a_through_the_proxy_match_the_baseline(fleet: Fleet) -> None:
    expected = {seed: chat(fleet.baseline, seed, "abA") for seed in (1, 2)}
    assert expected[1] != expected[2]  # else matching them would prove nothing
    for seed in (1, 2, 1):
        assert chat(fleet.proxy, seed, "abA") == expected[seed]
    # Streamed, as server-sent events, through the same proxy.
    for seed in (2, 1):
        assert chat(fleet.proxy, seed, "abA-stream", stream=True) == chat(
            fleet.baseline, seed, "abA-stream"
        )


def test_the_decode_servers_prefix_cache_keeps_b_apart_from_a(fleet: Fleet) -> None:
    reports = []
    for seed in (1, 2, 1):
        # A salt of its own: other tests sent these images behind the same first block.
        body = chat_body(seed, "cache", cache_salt="prefix-cache-test")
        status, reply = http_json(f"{fleet.proxy}/v1/chat/completions", body)
        assert status == 200
        # The decode connector's report: what it loaded and what its own cache had.
        reports.append(reply["kv_transfer_params"])
    assert [r["local_cached_tokens"] for r in reports[:2]] == [0, 0]
    assert reports[2]["local_cached_tokens"] > 0
    assert reports[0]["loaded_tokens"] > 0 and reports[1]["loaded_tokens"] > 0


def test_completions_through_the_proxy_match_the_baseline(fleet: Fleet) -> None:
    prompt = f"USER: completions {TEXT}\nASSISTANT:"
    kwargs: dict[str, Any] = {
        "model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0,
        "extra_body": {"return_token_ids": True},
    }  # fmt: skip
    want = client(fleet.baseline).completions.create(**kwargs).model_dump()
    got = client(fleet.proxy).completions.create(**kwargs).model_dump()
    assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
    streamed: list[int] = []
    for chunk in client(fleet.proxy).completions.create(stream=True, **kwargs):
        for choice in chunk.model_dump()["choices"]:
            streamed += choice.get("token_ids") or []
    assert streamed == want["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def recording(fleet: Fleet) -> Iterator[InProcessProxy]:
    """The proxy in this process, recording the legs it sends."""
    with InProcessProxy(Proxy(fleet.prefill_worker, [fleet.decode_worker], mrope=False)) as live:
        yield live


def decode_legs(recording: InProcessProxy, fleet: Fleet) -> list[dict[str, Any]]:
    return [s.body for s in recording.sent_to(fleet.decode)]


def test_the_hazard_the_original_body_on_a_language_model_only_decode(
    fleet: Fleet, recording: InProcessProxy
) -> None:
    # What existing proxies do: the original body, image included, to the decode worker.
    status, reply = http_json(f"{fleet.decode}/v1/chat/completions", chat_body(1, "orig"))
    assert status == 400 and reply["error"]["param"] == "image"
    assert reply["error"]["message"].startswith("At most 0 image(s) may be provided")
    status, _ = http_json(f"{recording.url}/v1/chat/completions", chat_body(1, "orig"))
    assert status == 200
    (leg,) = decode_legs(recording, fleet)[-1:]
    assert all(
        part.get("type") == "text" for m in leg["messages"] for part in m["content"]
    )  # the proxy never sends a media part to it


def stripped(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(body))
    for message in out["messages"]:
        message["content"] = [p for p in message["content"] if p["type"] == "text"]
    return out


def prefill_directly(fleet: Fleet, seed: int, variant: str) -> tuple[list[int], dict[str, Any]]:
    body = chat_body(seed, variant, max_tokens=1, kv_transfer_params={"do_remote_decode": True})
    status, reply = http_json(f"{fleet.prefill}/v1/chat/completions", body)
    assert status == 200
    return reply["prompt_token_ids"], reply["kv_transfer_params"]


def tokens_of(url: str, body: dict[str, Any]) -> list[int]:
    status, reply = http_json(f"{url}/v1/chat/completions", body)
    assert status == 200, reply
    tokens: list[int] = reply["choices"][0]["token_ids"]
    return tokens


@pytest.mark.parametrize("hazard", ["no_ids", "echo", "no_such_transfer", "no_salt"])
def test_no_silent_image_blind_answer_through_the_proxy(
    fleet: Fleet, recording: InProcessProxy, hazard: str
) -> None:
    """Each way vLLM answers a decode leg with HTTP 200 and the wrong image's (or no
    image's) tokens, reproduced on the real decode server; the proxy's own leg differs from
    the bad one exactly there, and its answer is right."""
    variant = f"hazard-{hazard}"
    ids, kv = prefill_directly(fleet, 2, variant)
    bad = {**stripped(chat_body(2, variant)), "cache_salt": f"{hazard}-salt"}
    forwarded = {**kv, "prompt_token_ids": ids}
    if hazard == "no_ids":
        bad["kv_transfer_params"] = kv
    elif hazard == "echo":
        bad.update(kv_transfer_params=forwarded, echo=True)
    elif hazard == "no_such_transfer":
        bad["kv_transfer_params"] = {**forwarded, "transfer_id": "no-such-transfer"}
    else:
        # B's decode after A's, with the same expanded ids and no salt: B gets A's blocks.
        a_ids, a_kv = prefill_directly(fleet, 1, variant)
        a_leg = {**a_kv, "prompt_token_ids": a_ids}
        tokens_of(fleet.decode, {**stripped(chat_body(1, variant)), "kv_transfer_params": a_leg})
        del bad["cache_salt"]
        bad["kv_transfer_params"] = forwarded
    expected = tokens_of(fleet.baseline, chat_body(2, variant))
    assert tokens_of(fleet.decode, bad) != expected  # the silent 200: a wrong answer

    status, reply = http_json(f"{recording.url}/v1/chat/completions", chat_body(2, variant))
    assert status == 200 and reply["choices"][0]["token_ids"] == expected
    leg = decode_legs(recording, fleet)[-1]
    sent_kv = leg["kv_transfer_params"]
    assert sent_kv["prompt_token_ids"] == reply_ids(recording, fleet)  # the prefill's own ids
    assert "echo" not in leg
    assert sent_kv["transfer_id"] == prefill_reply(recording, fleet)["transfer_id"]
    assert leg["cache_salt"].startswith("mm1:")


def reply_ids(recording: InProcessProxy, fleet: Fleet) -> list[int]:
    # The proxy asked its prefill for return_token_ids; the ids it forwarded are those.
    ids: list[int] = decode_legs(recording, fleet)[-1]["kv_transfer_params"]["prompt_token_ids"]
    assert len(ids) > 36  # the image's 36 placeholders, and the text
    return ids


def prefill_reply(recording: InProcessProxy, fleet: Fleet) -> dict[str, Any]:
    prefill_leg = recording.sent_to(fleet.prefill)[-1].body
    assert prefill_leg["return_token_ids"] is True and prefill_leg["max_tokens"] == 1
    # The transfer the proxy relayed is the one the prefill named (never invented).
    kv: dict[str, Any] = decode_legs(recording, fleet)[-1]["kv_transfer_params"]
    return kv


def test_refusals_are_openai_error_bodies_before_any_worker_is_called(fleet: Fleet) -> None:
    image_body = chat_body(1, "refused")
    # The core's order: an M-RoPE model's grids are refused before n is looked at, so n>1
    # is shown on the plain LLaVA fleet and the grids on one the proxy is told is M-RoPE.
    cases = (
        (True, image_body, "pd_decode_language_model_only_mrope", 400),
        (True, {**image_body, "n": 2}, "pd_decode_language_model_only_mrope", 400),
        (False, {**image_body, "n": 2}, "pd_decode_language_model_only_n_samples", 400),
        (True, {**image_body, "cache_salt": "tenant/secret"}, "pd_invalid_request", 400),
        (True, {"model": "tiny", "messages": [{"role": "user", "content": [
            {"type": "prompt_embeds", "data": "AAAA"}]}]}, "pd_invalid_request", 400),
    )  # fmt: skip
    for mrope, body, code, status in cases:
        proxy = Proxy(fleet.prefill_worker, [fleet.decode_worker], mrope=mrope)
        with InProcessProxy(proxy) as live:
            request = urllib.request.Request(
                f"{live.url}/v1/chat/completions", data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(request, timeout=30)
            error = json.loads(caught.value.read())["error"]
            assert (caught.value.code, error["code"]) == (status, code)
            assert caught.value.headers["X-SMG-Error-Code"] == code
            assert "secret" not in error["message"]
            assert live.sent == []  # no worker was called


def test_a_control_character_in_a_kept_data_url_is_refused_by_the_prefill(fleet: Fleet) -> None:
    # The proxy keeps a long data URL in the client's bytes and does not look for a raw
    # control character in it (the skim's one leniency): vLLM's parser, which gets those
    # bytes, must refuse the request. An error, never an answer, and no decode leg.
    raw = json.dumps(chat_body(1, "control")).encode()
    at = raw.index(b"base64,") + 200
    raw = raw[:at] + b"\x01" + raw[at:]
    with pytest.raises(json.JSONDecodeError, match="control character"):
        json.loads(raw)
    with InProcessProxy(Proxy(fleet.prefill_worker, [fleet.decode_worker], mrope=False)) as live:
        request = urllib.request.Request(
            f"{live.url}/v1/chat/completions", data=raw,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(request, timeout=60)
        assert 400 <= caught.value.code < 500
        assert "error" in json.loads(caught.value.read())
        assert len(live.sent_to(fleet.prefill)) == 1 and live.sent_to(fleet.decode) == []


def test_a_prefill_without_kv_parameters_is_a_502_for_an_image_and_recomputes_text(
    fleet: Fleet,
) -> None:
    # Left untagged, the TransferConnector stores nothing and the prefill returns nothing.
    untagged = HttpWorker(fleet.prefill, kv=PrefillKv(KvConnectorMode.PASSTHROUGH))
    with InProcessProxy(Proxy(untagged, [fleet.decode_worker], mrope=False)) as live:
        status, reply = http_json(f"{live.url}/v1/chat/completions", chat_body(1, "silent"))
        assert status == 502
        assert reply["error"]["code"] == "pd_decode_missing_kv_transfer_params"
        assert len(live.sent_to(fleet.prefill)) == 1 and live.sent_to(fleet.decode) == []
        got = tokens_of(live.url, chat_body(None, "silent-text"))
    assert got == tokens_of(fleet.baseline, chat_body(None, "silent-text"))


def test_a_client_that_disconnects_mid_stream_leaves_nothing_running(fleet: Fleet) -> None:
    body = chat_body(1, "disconnect", max_tokens=900, stream=True, ignore_eos=True)
    request = urllib.request.Request(
        f"{fleet.proxy}/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    response = urllib.request.urlopen(request, timeout=60)
    assert response.readline().startswith(b"data:")  # the decode is streaming
    assert running_requests(fleet.decode) == 1
    response.close()  # the client goes away
    wait_idle(fleet.decode, fleet.prefill)


def responses_input(seed: int | None, variant: str) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": f"{variant} {TEXT}"}]
    if seed is not None:
        content.insert(0, {"type": "input_image", "image_url": data_url(image(seed))})
    return [{"role": "user", "content": content}]


def responded(url: str, seed: int | None, variant: str, *, stream: bool = False) -> str:
    """The text of a greedy Responses answer through ``url``, with the openai client."""
    kwargs: dict[str, Any] = {"model": "tiny", "input": responses_input(seed, variant),
                              "max_output_tokens": 8, "temperature": 0}  # fmt: skip
    if not stream:
        return str(client(url).responses.create(**kwargs).output_text)
    deltas = [e.delta for e in client(url).responses.create(stream=True, **kwargs)
              if e.type == "response.output_text.delta"]  # fmt: skip
    return "".join(deltas)


def test_the_responses_api_through_p_d_answers_as_the_baseline(fleet: Fleet) -> None:
    expected = {seed: responded(fleet.baseline, seed, "responses") for seed in (1, 2)}
    assert expected[1] != expected[2]  # else matching them would prove nothing
    for seed in (1, 2, 1):
        assert responded(fleet.proxy, seed, "responses") == expected[seed]
    for seed in (2, 1):
        assert responded(fleet.proxy, seed, "responses", stream=True) == expected[seed]
    assert responded(fleet.proxy, None, "responses") == responded(fleet.baseline, None,
                                                                  "responses")  # fmt: skip


def test_the_responses_decode_leg_carries_no_image_and_stateful_requests_are_refused(
    fleet: Fleet,
) -> None:
    with InProcessProxy(Proxy(fleet.prefill_worker, [fleet.decode_worker], mrope=False)) as live:
        assert responded(live.url, 1, "responses-leg")
        (prefill,) = live.sent_to(fleet.prefill)
        (decode,) = live.sent_to(fleet.decode)
        assert prefill.url.endswith("/v1/chat/completions") and decode.url.endswith("/v1/responses")
        # The prefill sees the image, as its chat form (the same prompt vLLM renders).
        assert prefill.body["messages"][0]["content"][0]["type"] == "image_url"
        assert "input_image" not in json.dumps(decode.body)
        assert decode.body["kv_transfer_params"]["prompt_token_ids"]
        assert decode.body["cache_salt"].startswith("mm1:")
        with pytest.raises(openai.BadRequestError) as caught:
            client(live.url).responses.create(model="tiny", input=responses_input(1, "x"),  # type: ignore[arg-type]
                                              previous_response_id="resp_1")  # fmt: skip
        assert caught.value.body["code"] == "pd_invalid_request"  # type: ignore[index]
        assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
        assert len(live.sent) == 2  # the refused request reached no worker

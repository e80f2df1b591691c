"""Multimodal P/D on vLLM's own ``NixlConnector``, through the proxy, against real servers.

Two ``vllm serve`` workers of the tiny LLaVA at a time (``nixl_peers.NixlPairs``, started
once for this module on 127.0.0.1 and stopped by process id): a full-vision prefill
(``kv_producer``), which also answers as a full server when sent a plain request, and a
``--language-model-only`` decode (``kv_consumer``), both with their KV in host memory. First
on ``NixlConnector`` (pull: the decode reads the prefill's blocks), then on
``NixlPushConnector`` (the prefill writes them to the decode). ``pd-policy-proxy`` runs in
front of each pair without ``--kv-mode``: it reads the connector from the workers'
``/server_info``, which they serve in vLLM's development mode (this module's workers
alone of the NIXL ones: the others are described by the proxy's configuration file).

A transfer is proven by the decode's own NIXL metrics (transfers completed, bytes moved,
none failed), read before and after each request; never by ``cached_tokens``, which only
repeats what the prefill reported.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any, Final

import openai
import pytest
from http_peers import data_url, http_json, read_fleet
from live_engines import BLOCK_SIZE
from llava_prompts import TEXT
from nixl_peers import (
    LLAVA_BLOCK_BYTES,
    SWITCH_MARK,
    NixlPair,
    NixlPairs,
    Transfer,
    progress_thread_off,
)
from router_side import image
from tiny_models import TinyModel

from pd_policy import KvConnectorMode
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy.handoff_fields import REQUIRED_KV_FIELDS, missing_kv_fields
from pd_policy.tools.vectors.fixtures import NIXL
from pd_policy_vllm.openai.tools.vector_handoffs import NIXL_RETURNED

PULL: Final = "NixlConnector"
PUSH: Final = "NixlPushConnector"


@pytest.fixture(scope="module")
def pairs(llava: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NixlPairs]:
    root = tmp_path_factory.mktemp("nixl")
    with contextlib.closing(
        # Development mode: the tests hold the proxy reading NIXL from each /server_info.
        NixlPairs(llava, root, limits={"image": 1}, proxy_flags=("--no-mrope",), dev_mode=True)
    ) as running:
        yield running
    assert set(running.starts.values()) == {1}  # the tests of a connector ran together


@pytest.fixture
def pull(pairs: NixlPairs) -> NixlPair:
    return pairs.get(PULL)


@pytest.fixture
def push(pairs: NixlPairs) -> NixlPair:
    return pairs.get(PUSH)


#: The text before a ``late`` image: one filler less than ``TEXT`` puts the image's ids in
#: the prompt's partial last block (the test asserts where they are).
LATE_TEXT: Final = TEXT.rpartition(" describe")[0]


def messages(seed: int | None, variant: str, *, late: bool = False) -> list[dict[str, Any]]:
    """A user message: the image, then the text; ``late``, a shorter text, then the image."""
    text = {"type": "text", "text": f"{variant} {LATE_TEXT if late else TEXT}"}
    if seed is None:
        return [{"role": "user", "content": [text]}]
    picture = {"type": "image_url", "image_url": {"url": data_url(image(seed))}}
    return [{"role": "user", "content": [text, picture] if late else [picture, text]}]


def chat_body(
    seed: int | None, variant: str, *, late: bool = False, **extra: Any
) -> dict[str, Any]:
    return {"model": "tiny", "messages": messages(seed, variant, late=late), "max_tokens": 8,
            "temperature": 0, "return_token_ids": True, **extra}  # fmt: skip


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


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


def posted(url: str, body: dict[str, Any]) -> dict[str, Any]:
    status, reply = http_json(f"{url}/v1/chat/completions", body, timeout=120)
    assert status == 200, reply
    answer: dict[str, Any] = reply
    return answer


def tokens(reply: dict[str, Any]) -> list[int]:
    ids: list[int] = reply["choices"][0]["token_ids"]
    return ids


def a_b_a(pair: NixlPair, variant: str) -> None:
    """Images A, B, A through the pair's proxy equal the full server's answers, each with a
    NIXL transfer; then B and A streamed."""
    expected = {seed: chat(pair.baseline, seed, variant) for seed in (1, 2)}
    assert expected[1] != expected[2]  # else matching them would prove nothing
    for seed in (1, 2, 1):
        with Transfer(pair):
            assert chat(pair.proxy, seed, variant) == expected[seed]
    for seed in (2, 1):
        want = chat(pair.baseline, seed, f"{variant}-stream")
        with Transfer(pair):
            assert chat(pair.proxy, seed, f"{variant}-stream", stream=True) == want


def test_the_proxy_reads_nixl_from_each_workers_server_info(pull: NixlPair) -> None:
    prefill, (decode,) = read_fleet("--prefill", pull.prefill, "--decode", pull.decode)
    assert prefill.kv.mode is KvConnectorMode.NIXL
    assert decode.capability.language_model_only
    # NIXL loads the transfer the handoff names; a failed load is an error (vLLM's default).
    assert decode.capability.decode_kv == DecodeKv(KvLoad.BY_REQUEST, LoadFailure.FAIL)
    for server in pull.servers:
        assert (SWITCH_MARK in server.log.read_text()) is progress_thread_off()


def test_pull_images_a_b_a_match_a_full_server(pull: NixlPair) -> None:
    a_b_a(pull, "nixl-abA")


def test_pull_an_image_in_the_partial_last_block_comes_across(
    pull: NixlPair, llava: TinyModel
) -> None:
    body = chat_body(2, "nixl-late", late=True)
    baseline = posted(pull.baseline, body)
    ids: list[int] = baseline["prompt_token_ids"]
    image_at = [i for i, t in enumerate(ids) if t == llava.image_token_id]
    assert len(image_at) == llava.image_tokens
    whole = len(ids) // BLOCK_SIZE * BLOCK_SIZE
    assert len(ids) > whole and image_at[-1] >= whole  # image ids past the last whole block
    with Transfer(pull) as transfer:
        assert tokens(posted(pull.proxy, body)) == tokens(baseline)
    # A fresh prompt (its variant leads it): every block moved, the partial one included.
    assert transfer.bytes == math.ceil(len(ids) / BLOCK_SIZE) * LLAVA_BLOCK_BYTES


def test_pull_text_matches_a_full_server(pull: NixlPair) -> None:
    expected = chat(pull.baseline, None, "nixl-text")
    with Transfer(pull):
        assert chat(pull.proxy, None, "nixl-text") == expected


def shape(value: Any) -> Any:
    """A JSON value's type, and its elements' shape for a list (of the first element)."""
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def test_the_handoff_as_nixl_writes_it(pull: NixlPair) -> None:
    """What this vLLM's ``NixlConnector`` returns from a prefill carries every field the
    core's ``nixl`` contract requires, has the shape of the conformance vectors' NIXL
    handoff, and is enough: relayed by hand to the decode, it answers as the full server."""
    body = chat_body(1, "nixl-handoff")
    tag = {"do_remote_decode": True, "do_remote_prefill": False}
    prefill = posted(pull.prefill, {**body, "max_tokens": 1, "kv_transfer_params": tag})
    params: dict[str, Any] = prefill["kv_transfer_params"]
    assert missing_kv_fields(KvConnectorMode.NIXL, params) == ()
    assert set(REQUIRED_KV_FIELDS[KvConnectorMode.NIXL]) <= set(params)
    assert params["transfer_mode"] == "pull" and params["do_remote_prefill"] is True
    # The vectors' fixtures have this shape: the same fields, each of the same JSON type.
    real = {k: shape(v) for k, v in params.items()}
    assert real == {k: shape(v) for k, v in NIXL.items()}
    assert real == {k: shape(v) for k, v in NIXL_RETURNED.items()}
    text_only = [{"role": "user", "content": [p for p in body["messages"][0]["content"]
                                              if p["type"] == "text"]}]  # fmt: skip
    relayed = {**params, "prompt_token_ids": prefill["prompt_token_ids"]}
    leg = {**body, "messages": text_only, "cache_salt": "nixl-handoff",
           "kv_transfer_params": relayed}  # fmt: skip
    expected = tokens(posted(pull.baseline, body))
    with Transfer(pull):
        assert tokens(posted(pull.decode, leg)) == expected


def test_push_images_a_b_a_match_a_full_server(push: NixlPair) -> None:
    prefill, _ = read_fleet("--prefill", push.prefill, "--decode", push.decode)
    assert prefill.kv.mode is KvConnectorMode.NIXL_PUSH  # from /server_info, no --kv-mode
    a_b_a(push, "nixl-push-abA")


def test_push_text_matches_a_full_server(push: NixlPair) -> None:
    expected = chat(push.baseline, None, "nixl-push-text")
    with Transfer(push):
        assert chat(push.proxy, None, "nixl-push-text") == expected

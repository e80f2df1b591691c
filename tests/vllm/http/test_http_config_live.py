"""A fleet described by the configuration file alone, against real ``vllm serve`` workers
that do not run vLLM's development mode (no ``/server_info``).

Two workers of the tiny LLaVA on ``NixlConnector`` (started once for this module on
127.0.0.1, stopped by process id): a full-vision prefill, which the file describes (its
``kv_transfer_config``), and a ``--language-model-only`` decode, which nothing describes:
no table of the file, no ``--decode-capability``. The proxy takes it as
language-model-only (fail closed), and images A, B, A come out equal to a full server's
(the prefill, sent plain requests), every decode leg without its image, and each
transfer proven by the decode's NIXL metrics.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from http_peers import InProcessProxy, data_url, http_json
from llava_prompts import TEXT
from nixl_peers import Transfer, nixl_config, nixl_server
from router_side import image
from servers import running
from tiny_models import TinyModel

from pd_policy import Support
from pd_policy_vllm.http.cli import configuration, read_fleet
from pd_policy_vllm.http.proxy import Proxy


@pytest.fixture(scope="module")
def workers(llava: TinyModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    tuple[str, str]
]:  # fmt: skip
    logs = tmp_path_factory.mktemp("config-live")
    # As every worker of these tests runs (no development mode); this file is the test's own.
    p = nixl_server("prefill", llava, logs, "kv_producer", limits={"image": 1})
    d = nixl_server("decode", llava, logs, "kv_consumer", language_model_only=True)
    with running([p, d]):
        yield p.url, d.url


def _body(seed: int) -> dict[str, Any]:
    content = [{"type": "image_url", "image_url": {"url": data_url(image(seed))}},
               {"type": "text", "text": f"config {TEXT}"}]  # fmt: skip
    return {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 6, "temperature": 0, "return_token_ids": True}  # fmt: skip


def test_an_undescribed_decode_without_dev_mode_serves_images_equal_to_a_full_server(
    workers: tuple[str, str], tmp_path: Path
) -> None:
    prefill, decode = workers
    status, _ = http_json(f"{prefill}/server_info", None)
    assert status == 404  # no development mode here
    config = tmp_path / "proxy.toml"
    config.write_text(
        "mrope = false\n\n[[workers]]\n"
        f'url = "{prefill}"\nrole = "prefill"\n'
        f"kv_transfer_config = {_inline(nixl_config('kv_producer'))}\n"
        f'\n[[workers]]\nurl = "{decode}"\nrole = "decode"\n'
    )
    args, _ = configuration(["--config", str(config)], {})
    fleet = asyncio.run(read_fleet(args))
    (member,) = fleet.of("decode")
    assert member.worker.assumed and member.worker.capability.supports_vision is Support.FALSE
    with InProcessProxy(Proxy(fleet=fleet, mrope=False)) as proxy:
        for seed in (1, 2, 1):
            status, want = http_json(f"{prefill}/v1/chat/completions", _body(seed))
            assert status == 200, want
            before = len(proxy.sent)
            with Transfer(decode):
                status, got = http_json(f"{proxy.url}/v1/chat/completions", _body(seed))
            assert status == 200, got
            assert got["choices"][0]["token_ids"] == want["choices"][0]["token_ids"]
            legs = [s for s in proxy.sent[before:] if s.url.startswith(decode)]
            assert legs and all("image_url" not in json.dumps(s.body) for s in legs)


def _inline(table: dict[str, Any]) -> str:
    """``table`` as a TOML inline table."""
    return "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + " }"

"""Through the proxy: a prefill that answers ``kv_transfer_params: {}`` (or a handoff
without its connector's fields) for an image request is a 502 to the client, and the
decode worker, which would answer image-blind, is never called."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web
from test_http_proxy_faults import chat, never, run

from pd_policy import ERROR_CODE_HEADER, KvConnectorMode

CODE = "pd_decode_missing_kv_transfer_params"


def prefill_returning(params: Any) -> Any:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"prompt_token_ids": [1, 2, 3], "kv_transfer_params": params})

    return handler


async def decode_ok(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"object": "chat.completion", "choices": []})


# Mooncake mints the handoff before prefill: nothing a prefill returns is relayed.
@pytest.mark.parametrize(
    "mode", [KvConnectorMode.NIXL, KvConnectorMode.TRANSFER, KvConnectorMode.PASSTHROUGH]
)
def test_an_empty_handoff_for_an_image_is_a_502_and_decode_is_never_called(
    mode: KvConnectorMode,
) -> None:
    status, headers, body, seen = run(prefill_returning({}), never, chat(), kv=mode)
    assert (status, seen) == (502, ["prefill"])
    assert headers[ERROR_CODE_HEADER] == CODE
    assert json.loads(body)["error"]["code"] == CODE


def test_a_transfer_shaped_handoff_is_no_nixl_handoff() -> None:
    # What the TransferConnector returns names no NIXL engine or blocks.
    returned = {"do_remote_prefill": True, "transfer_id": "t", "remote_host": "10.9.8.7"}
    status, _, body, seen = run(prefill_returning(returned), never, chat(),
                                kv=KvConnectorMode.NIXL)  # fmt: skip
    assert (status, seen) == (502, ["prefill"])
    message = json.loads(body)["error"]["message"]
    assert "remote_block_ids" in message and "10.9.8.7" not in message


def test_a_text_request_still_recomputes_over_an_empty_handoff() -> None:
    status, _, _, seen = run(prefill_returning({}), decode_ok, chat(image=False),
                             kv=KvConnectorMode.NIXL)  # fmt: skip
    assert (status, seen) == (200, ["prefill", "decode"])

"""What the stand-in KV worker says: its configuration as vLLM's development mode shows it,
its completions as a vLLM prefill or decode answers them, and its KV events as vLLM's
block pool fills them (vLLM's own classes, ``vllm.distributed.kv_events``).
"""

from __future__ import annotations

import base64
import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored

from kv_stub_prompt import Prompt
from pd_policy.cache.kv_blocks import HashAlgo

__all__ = [
    "completion",
    "error",
    "model_list",
    "removed_event",
    "server_config",
    "stored_event",
    "tensor",
]


def model_list(model: str) -> dict[str, Any]:
    """``/v1/models``: owned by ``vllm``, which SMG's gateway reads as a vLLM worker."""
    entry = {"id": model, "object": "model", "created": 0, "owned_by": "vllm",
             "root": model, "max_model_len": 1 << 16}  # fmt: skip
    return {"object": "list", "data": [entry]}


def error(status: int, message: str) -> dict[str, Any]:
    """vLLM's error body."""
    return {"error": {"message": message, "type": "BadRequestError", "code": status}}


def tensor(data: bytes, size: int) -> str:
    """A stand-in for an image's processed tensor as a render returns it: ``size`` bytes
    drawn from the image's ``data``, base64."""
    seed = hashlib.sha256(data).digest()
    return base64.b64encode((seed * (size // 32 + 1))[:size]).decode()


def server_config(
    name: str, prefill: bool, *, model: str, block_size: int, algo: HashAlgo, events: int,
    replay: int, connector: str = "NixlConnector",
) -> dict[str, Any]:  # fmt: skip
    """The ``vllm_config`` of ``/server_info``: a NIXL producer (a prefill, full vision,
    publishing its KV events on ``tcp://*:events`` with a replay socket on ``replay``)
    or a NIXL consumer (a language-model-only decode), prefix caching on; ``connector``
    names the NIXL connector (``NixlPushConnector``: push)."""
    config: dict[str, Any] = {
        "model_config": {"model": model, "multimodal_config": {"language_model_only": not prefill}},
        "cache_config": {"block_size": block_size, "enable_prefix_caching": True,
                         "prefix_caching_hash_algo": algo.value},
        "parallel_config": {"data_parallel_size": 1},
        "kv_transfer_config": {"kv_connector": connector, "engine_id": name,
                               "kv_role": "kv_producer" if prefill else "kv_consumer"},
    }  # fmt: skip
    if prefill:
        config["kv_events_config"] = {
            "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{events}",
            "replay_endpoint": f"tcp://*:{replay}", "topic": "", "buffer_steps": 10_000,
            "hwm": 100_000, "max_queue_size": 100_000,
        }  # fmt: skip
    return config


def completion(
    name: str, body: Mapping[str, Any], prompt: Prompt, *, chat: bool, cached: int,
    handoff: tuple[int, int] | None,
) -> dict[str, Any]:  # fmt: skip
    """A one-token completion of ``prompt`` by worker ``name`` (its text), ``cached`` of its
    tokens read from the prefix cache: the expanded ids when ``body`` asks
    (``return_token_ids``), and NIXL's handoff, ``(blocks, port)``, when given."""
    tokens = len(prompt.token_ids)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens + 1, "completion_tokens": 1,
             "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length",
                              "stop_reason": None}  # fmt: skip
    if chat:
        choice["message"] = {"role": "assistant", "content": name}
    else:
        choice["text"] = name
    answer: dict[str, Any] = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()), "model": body.get("model"), "choices": [choice],
        "usage": usage,
    }  # fmt: skip
    if body.get("return_token_ids"):
        # vLLM puts a chat prompt's ids at the top, a completion's in its choice.
        (answer if chat else choice)["prompt_token_ids"] = list(prompt.token_ids)
    if handoff is not None:
        blocks, port = handoff
        answer["kv_transfer_params"] = {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": list(range(blocks)), "remote_engine_id": name,
            "remote_request_id": answer["id"], "remote_host": "127.0.0.1",
            "remote_port": port, "tp_size": 1,
        }  # fmt: skip
    return answer


def _extra_keys(prompt: Prompt, start: int, stop: int) -> tuple[Any, ...] | None:
    # As vLLM publishes them, untagged: (identifier, offset in the block) per item the
    # block overlaps, then the salt on the first block.
    keys: list[Any] = [
        (item.identifier, item.offset - start)
        for item in prompt.items
        if item.offset < stop and item.offset + item.length > start
    ]
    if start == 0 and prompt.cache_salt:
        keys.append(prompt.cache_salt)
    return tuple(keys) if keys else None


def stored_event(prompt: Prompt, chain: Sequence[int], hits: int, block_size: int) -> BlockStored:
    """The ``BlockStored`` a worker publishes when it caches ``chain[hits:]``, the
    blocks of ``prompt`` it computed."""
    start, stop = hits * block_size, len(chain) * block_size
    return BlockStored(
        block_hashes=list(chain[hits:]),
        parent_block_hash=chain[hits - 1] if hits else None,
        token_ids=list(prompt.token_ids[start:stop]),
        block_size=block_size,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        extra_keys=[
            _extra_keys(prompt, at, at + block_size) for at in range(start, stop, block_size)
        ],
        group_idx=0,
    )


def removed_event(blocks: Sequence[int]) -> BlockRemoved:
    """The ``BlockRemoved`` a worker publishes when it evicts ``blocks``."""
    return BlockRemoved(block_hashes=list(blocks), medium="GPU", group_idx=0)

"""The peers of the KV-routing tests: stand-in prefills that state their KV cache as SMG's
servicer does, vLLM's own publisher of their KV events (``ZmqEventPublisher``, on
loopback ``ipc://`` sockets), and the block hashes the engine behind the servicer gives a
request.

``engine_chain`` is the engine's side, built from the peers' code, not from the router's:
the servicer's branch (``has_preprocessed_mm_payload``), its preprocessed prompt
(``VllmEngineServicer._build_preprocessed_mm_inputs``, the very method) or its identity
salt (``mm_identity_cache_salt``), vLLM's feature order and identifier
(``argsort_mm_positions``, ``InputProcessor._get_mm_identifier``) and its request block
hasher. Each identifier and salt is a string of its own, as the engine core holds the
keys it decoded.
"""

from __future__ import annotations

import struct
import time
from types import SimpleNamespace
from typing import Any

import attrs
import torch
from engines import LanguageModelOnlyDecodeEngine, PrefillEngine
from smg_grpc_servicer.vllm import mm_keys, mm_salt  # type: ignore[import-untyped]
from smg_grpc_servicer.vllm.servicer import VllmEngineServicer  # type: ignore[import-untyped]
from vllm import SamplingParams
from vllm.distributed.kv_events import BlockStored, KVEventBatch, ZmqEventPublisher
from vllm.multimodal.inputs import MultiModalFeatureSpec
from vllm.multimodal.utils import argsort_mm_positions
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.request import Request

from pd_policy_grpc.kv_routing import KvPublisher
from pd_policy_grpc.wire import common, pb

__all__ = ["BLOCK", "Decode", "Prefill", "Publisher", "engine_chain", "image", "text"]

BLOCK = 16
IMAGE_TOKEN = 9
#: 64 tokens, four blocks: the image's run starts in the first, so every block names it.
HEAD, RUN, TAIL = [1, 2, 3, 4], 16, list(range(100, 144))


def _own(text: str) -> str:
    return "".join(list(text))


def image(
    digest: str, rid: str = "r", *, pixels: bool = True, placed: bool = False
) -> pb.GenerateRequest:
    """An image request; without ``pixels``, its bare identity (a decode leg's form),
    ``placed`` with its placeholder run."""
    request = pb.GenerateRequest(request_id=rid, stream=True)
    request.tokenized.input_ids.extend([*HEAD, *[IMAGE_TOKEN] * RUN, *TAIL])
    request.sampling_params.max_tokens = 4
    batch = request.mm_inputs
    batch.mm_hashes.append(digest)
    if pixels:
        batch.modality = common.IMAGE
        batch.pixel_values.shape.extend([1, 4])
        batch.pixel_values.dtype = "float32"
        batch.pixel_values.inline = struct.pack("<4f", 0.1, 0.2, 0.3, 0.4)
        batch.batched_keys.append("pixel_values")
        batch.im_token_id = IMAGE_TOKEN
    if pixels or placed:
        batch.mm_placeholders.add(offset=len(HEAD), length=RUN)
    return request


def text(rid: str = "t") -> pb.GenerateRequest:
    request = image("x", rid)
    request.ClearField("mm_inputs")
    return request


def engine_chain(request: pb.GenerateRequest, block_size: int = BLOCK) -> list[int]:
    """The block hashes the engine behind SMG's servicer publishes for ``request``."""
    batches = mm_keys.mm_batches(request)
    loaded = [b for b in batches if mm_salt.has_preprocessed_mm_payload(b)]
    ids, features, salt = list(request.tokenized.input_ids), None, None
    if loaded:
        servicer = SimpleNamespace(
            engine=SimpleNamespace(model_config=SimpleNamespace(dtype=torch.float32))
        )
        prompt = VllmEngineServicer._build_preprocessed_mm_inputs(
            servicer, request.tokenized, loaded
        )
        processor = SimpleNamespace(lora_config=None)
        ids, features = prompt["prompt_token_ids"], []
        for modality, i in argsort_mm_positions(prompt["mm_placeholders"]):
            base = prompt["mm_hashes"][modality][i]
            features.append(
                MultiModalFeatureSpec(
                    data=None,
                    modality=modality,
                    identifier=_own(InputProcessor._get_mm_identifier(processor, base, None)),
                    mm_position=prompt["mm_placeholders"][modality][i],
                    mm_hash=_own(base),
                )
            )
    elif batches:
        salt = mm_salt.mm_identity_cache_salt(mm_keys.mm_identity_hashes(batches))
    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)  # PYTHONHASHSEED, as the router's seed
    served = Request(
        request_id="r",
        prompt_token_ids=ids,
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        mm_features=features or None,
        cache_salt=None if salt is None else _own(salt),
        block_hasher=kv_cache_utils.get_request_block_hasher(block_size, hash_fn),
    )
    return [kv_cache_utils.maybe_convert_block_hash(h) for h in served.block_hashes]


class Prefill(PrefillEngine):
    """A prefill whose ``GetServerInfo`` states its KV cache as SMG's servicer does."""

    def __init__(self, block_size: int = BLOCK, ranks: int = 1) -> None:
        super().__init__()
        self.block_size, self.ranks = block_size, ranks

    async def GetServerInfo(self, request: Any, context: Any) -> pb.GetServerInfoResponse:  # noqa: N802
        info = await super().GetServerInfo(request, context)
        info.block_size, info.data_parallel_size = self.block_size, self.ranks
        return info


class Decode(LanguageModelOnlyDecodeEngine):
    """The fleet's decode: it serves the text-plus-hashes leg."""


@attrs.define
class Publisher:
    """vLLM's publisher of one prefill's KV events, on ``ipc://`` sockets in ``folder``."""

    folder: str
    name: str
    replay: bool = True
    vllm: Any = None

    def __attrs_post_init__(self) -> None:
        replay = f"ipc://{self.folder}/{self.name}-replay" if self.replay else None
        self.vllm = ZmqEventPublisher(0, endpoint=self.endpoint, replay_endpoint=replay)

    @property
    def endpoint(self) -> str:
        return f"ipc://{self.folder}/{self.name}"

    def stated(self) -> KvPublisher:
        replay = f"ipc://{self.folder}/{self.name}-replay" if self.replay else None
        return KvPublisher(self.endpoint, replay=replay)

    def publish(self, *chains: list[int]) -> None:
        events = [
            BlockStored(
                block_hashes=chain,
                parent_block_hash=None,
                token_ids=[0] * (BLOCK * len(chain)),
                block_size=BLOCK,
                lora_id=None,
                medium="GPU",
                lora_name=None,
            )
            for chain in chains
        ]
        self.vllm.publish(KVEventBatch(ts=time.time(), events=events))

"""The connector: the scheduler side plans stores and loads per request, the worker side
copies blocks as each step's metadata says (see the package's docs)."""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from .blocks import Copy, TransferMetadata, load_blocks, prompt_digest, save_blocks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["CONNECTOR_NAME", "TransferConnector"]

logger = logging.getLogger(__name__)

#: The class name to give ``kv_connector``.
CONNECTOR_NAME: Final = "TransferConnector"
_META_FILE: Final = "meta.json"


@dataclass
class _Producing:
    transfer_id: str
    prompt: list[int]
    block_ids: list[int] = field(default_factory=list)


@dataclass
class _Stored:
    transfer_id: str
    num_tokens: int
    digest: str


@dataclass
class _Load:
    transfer_id: str
    start: int
    end: int
    local_cached_tokens: int


class TransferConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """The connector; one instance per role (scheduler or worker) per engine."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        config = self._kv_transfer_config
        directory = config.get_from_extra_config("transfer_dir", None)
        if not directory:
            raise ValueError("TransferConnector needs kv_connector_extra_config.transfer_dir")
        self._dir = Path(directory)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._partial = bool(config.get_from_extra_config("partial_blocks", True))
        self._return_params = bool(config.get_from_extra_config("return_params", True))
        self._block_size: int = vllm_config.cache_config.block_size
        self._producer: bool = config.is_kv_producer
        self._consumer: bool = config.is_kv_consumer
        # Scheduler-side state, by request id.
        self._producing: dict[str, _Producing] = {}
        self._stored: dict[str, _Stored] = {}
        self._planned: dict[str, _Load] = {}
        self._loading: dict[str, _Load] = {}
        self._loaded: dict[str, _Load] = {}
        self._refused: dict[str, str] = {}

    # --- scheduler side -------------------------------------------------------------

    def on_new_request(self, request: Request) -> None:
        params = request.kv_transfer_params or {}
        if self._producer and params.get("do_remote_decode"):
            transfer_id = str(params.get("transfer_id") or uuid.uuid4().hex)
            self._producing[request.request_id] = _Producing(
                transfer_id, list(request.prompt_token_ids or [])
            )

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int, bool]:
        params = request.kv_transfer_params or {}
        transfer_id = params.get("transfer_id")
        if not (self._consumer and params.get("do_remote_prefill") and transfer_id):
            return 0, False
        prompt = list(request.prompt_token_ids or [])
        reason = self._refusal(str(transfer_id), prompt)
        if reason is not None:
            logger.error("transfer %s not loaded: %s", transfer_id, reason)
            self._refused[request.request_id] = reason
            return 0, False
        meta = json.loads((self._dir / str(transfer_id) / _META_FILE).read_text())
        # Decode computes the last prompt token itself: it needs its logits.
        end = min(int(meta["num_tokens"]), len(prompt) - 1)
        if not self._partial:
            end = end // self._block_size * self._block_size
        plan = _Load(str(transfer_id), num_computed_tokens, end, num_computed_tokens)
        self._planned[request.request_id] = plan
        if end <= num_computed_tokens:
            return 0, False
        return end - num_computed_tokens, False

    def _refusal(self, transfer_id: str, prompt: list[int]) -> str | None:
        meta_path = self._dir / transfer_id / _META_FILE
        if not meta_path.exists():
            return "no such transfer"
        meta = json.loads(meta_path.read_text())
        if meta["block_size"] != self._block_size:
            return f"block size {meta['block_size']} != {self._block_size}"
        if meta["prompt_digest"] != prompt_digest(prompt):
            return "the decode prompt is not the prefill's expanded prompt"
        return None

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        plan = self._planned.pop(request.request_id, None)
        if plan is None:
            return
        if num_external_tokens > 0:
            self._loading[request.request_id] = plan
        else:
            self._loaded[request.request_id] = plan

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> TransferMetadata:
        meta = TransferMetadata(transfer_dir=str(self._dir))
        for new in scheduler_output.scheduled_new_reqs:
            req_id = new.req_id
            blocks = list(new.block_ids[0])
            if req_id in self._loading:
                load = self._loading.pop(req_id)
                first, last = load.start // self._block_size, math.ceil(load.end / self._block_size)
                meta.copies.append(Copy(load.transfer_id, blocks[first:last], False, first))
                self._loaded[req_id] = load
            elif req_id in self._producing:
                self._producing[req_id].block_ids = blocks
                done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens[req_id]
                self._maybe_store(meta, req_id, done)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            producing = self._producing.get(req_id)
            if producing is None:
                continue
            new_blocks = cached.new_block_ids[i]
            if new_blocks is not None:
                if req_id in cached.resumed_req_ids:
                    producing.block_ids = list(new_blocks[0])
                else:
                    producing.block_ids.extend(new_blocks[0])
            done = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id]
            self._maybe_store(meta, req_id, done)
        return meta

    def _maybe_store(self, meta: TransferMetadata, req_id: str, computed: int) -> None:
        # Store once, on the step whose forward completes the prompt (chunked prefill
        # may take several), every block covering it, the partial last one included.
        producing = self._producing[req_id]
        if computed < len(producing.prompt):
            return
        del self._producing[req_id]
        blocks = producing.block_ids[: math.ceil(len(producing.prompt) / self._block_size)]
        meta.copies.append(Copy(producing.transfer_id, blocks, True))
        self._stored[req_id] = _Stored(
            producing.transfer_id, len(producing.prompt), prompt_digest(producing.prompt)
        )

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        req_id = request.request_id
        self._producing.pop(req_id, None)
        self._planned.pop(req_id, None)
        self._loading.pop(req_id, None)
        stored = self._stored.pop(req_id, None)
        if stored is not None:
            # The blocks were saved synchronously during the forward: nothing is pending.
            meta = {
                "num_tokens": stored.num_tokens,
                "prompt_digest": stored.digest,
                "block_size": self._block_size,
            }
            (self._dir / stored.transfer_id / _META_FILE).write_text(json.dumps(meta))
            if not self._return_params:
                return False, None
            return False, {
                "do_remote_prefill": True,
                "do_remote_decode": False,
                "transfer_id": stored.transfer_id,
                "num_tokens": stored.num_tokens,
                "prompt_digest": stored.digest,
                "mm_hashes": [f.identifier for f in request.mm_features],
            }
        loaded = self._loaded.pop(req_id, None)
        if loaded is not None:
            return False, {
                "transfer_id": loaded.transfer_id,
                "loaded_tokens": max(loaded.end - loaded.start, 0),
                "local_cached_tokens": loaded.local_cached_tokens,
            }
        refused = self._refused.pop(req_id, None)
        if refused is not None:
            return False, {"loaded_tokens": 0, "error": refused}
        return False, None

    # --- worker side: stateless, everything comes from the step's metadata ----------

    def _copies(self, store: bool) -> tuple[Path, list[Copy]]:
        meta = self._get_connector_metadata()
        assert isinstance(meta, TransferMetadata)
        return Path(meta.transfer_dir), [c for c in meta.copies if c.store is store]

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        directory, loads = self._copies(store=False)
        if loads and forward_context.attn_metadata is not None:
            load_blocks(directory, loads, forward_context.no_compile_layers)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        directory, stores = self._copies(store=True)
        save_blocks(directory, stores, layer_name, kv_layer)

    def wait_for_save(self) -> None:
        return

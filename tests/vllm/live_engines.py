"""How the tests configure and start vLLM: in-process, small, deterministic.

The environment this needs (in-process engines, no hub) is set by ``conftest.py``
before vLLM is imported.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Final

from tiny_models import TinyModel

__all__ = [
    "BLOCK_SIZE",
    "ENGINE_SETTINGS",
    "TRANSFER_DIR",
    "connector",
    "engine_config",
    "start_engine",
]

#: Settings of every test engine and config: small, deterministic, fp32 (bf16 falls back to
#: slow kernels on AVX2-only CPUs and gives less stable tokens).
ENGINE_SETTINGS: Final[dict[str, Any]] = {
    "kv_cache_memory_bytes": 64 * 2**20,
    "enforce_eager": True,
    "dtype": "float32",
    "max_model_len": 1024,
    "max_num_seqs": 2,
    "seed": 0,
}
#: A block smaller than the CPU default (128), so a 100-token prompt spans several blocks.
BLOCK_SIZE: Final = 32


def engine_config(model: TinyModel, **overrides: Any) -> Any:
    """The ``VllmConfig`` an engine of ``model`` would run with (no engine is started)."""
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(model=str(model.path), **ENGINE_SETTINGS, **overrides)
    return args.create_engine_config()


#: Where the live P/D tests' connector keeps its transfers.
TRANSFER_DIR: Final = Path(tempfile.mkdtemp(prefix="pd-policy-transfers-"))


def start_engine(model: TinyModel, **overrides: Any) -> Any:
    """A live in-process ``LLM`` of ``model``.

    Every engine gets a KV connector, an inert producer unless the test names
    another: in one process, vLLM keeps the worker side of the connector in a
    global, so once one engine has a connector, an engine without one fails on
    its first step (``assert kv_connector_metadata is not None``). A producer
    stores nothing unless a request asks, and is not a consumer, so vLLM's
    multimodal settings stay as the test set them.
    """
    from vllm import LLM

    from pd_policy_vllm.transfer_connector import kv_transfer_config

    overrides.setdefault("kv_transfer_config", kv_transfer_config("kv_producer", TRANSFER_DIR))
    return LLM(model=str(model.path), **ENGINE_SETTINGS, **overrides)


def connector(role: str, transfer_dir: Path) -> dict[str, Any]:
    """The ``kv_transfer_config`` of a ``TransferConnector`` in ``role`` over ``transfer_dir``."""
    from pd_policy_vllm.transfer_connector import kv_transfer_config

    return kv_transfer_config(role, transfer_dir)

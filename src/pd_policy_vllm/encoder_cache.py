"""E/P/D engines: their encoder-cache role, read from a live vLLM, and the config that sets it.

vLLM keeps one encoder-cache role per process (the worker-side connector is a
process global), so the three engines of E/P/D run as three processes: three
``vllm serve`` workers (each started with
``--ec-transfer-config`` ``json.dumps(ec_transfer_config(...))`` and
``--enable-scale-out``) behind ``pd-policy-proxy --encode``, for instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from pd_policy import EncoderCacheRole

__all__ = ["EC_CONNECTOR", "ec_transfer_config", "encoder_cache_role"]

#: vLLM's connector that stores encoder outputs on a local filesystem, keyed by item hash.
#: It ignores ``ec_transfer_params`` and looks items up on disk by hash alone, so a stale
#: store answers silently: give every deployment (every test session) a fresh directory.
EC_CONNECTOR: Final = "ECExampleConnector"
_VLLM_ROLES: Final = {
    EncoderCacheRole.PRODUCER: "ec_producer",
    EncoderCacheRole.CONSUMER: "ec_consumer",
}


def ec_transfer_config(role: EncoderCacheRole, store: str | Path) -> dict[str, Any]:
    """The ``ec_transfer_config`` of an engine in ``role`` over the directory ``store``.

    ``PRODUCER``: an encoder-only engine (``ec_producer``); ``CONSUMER``: a prefill
    that loads encoder outputs by hash (``ec_consumer``). Raises ``ValueError`` for
    another role: an engine with no role takes no config.
    """
    if role not in _VLLM_ROLES:
        raise ValueError(f"an engine's encoder-cache config needs producer or consumer, not {role}")
    return {
        "ec_connector": EC_CONNECTOR,
        "ec_role": _VLLM_ROLES[role],
        "ec_connector_extra_config": {"shared_storage_path": str(store)},
    }


def encoder_cache_role(source: object) -> EncoderCacheRole:
    """The encoder-cache role of the engine behind ``source`` (an ``LLM``, an engine or a
    ``VllmConfig``), as vLLM reads its ``ec_transfer_config``
    ([`EncoderCacheRole.from_vllm`][pd_policy.encoder_cache.EncoderCacheRole.from_vllm]).

    ``UNKNOWN`` when ``source`` does not lead to a ``VllmConfig`` (a bare ``ModelConfig``
    does not know the role).
    """
    node = source
    for hop in ("llm_engine", "vllm_config"):
        inner = getattr(node, hop, None)
        if inner is not None:
            node = inner
    if not hasattr(node, "ec_transfer_config"):
        return EncoderCacheRole.UNKNOWN
    config = node.ec_transfer_config
    if config is None:
        return EncoderCacheRole.NONE
    return EncoderCacheRole.from_vllm(
        getattr(config, "ec_role", None), getattr(config, "ec_connector", None)
    )

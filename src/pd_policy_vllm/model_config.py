"""Reaching a vLLM ``ModelConfig`` and its multimodal part, whatever the caller holds.

A servicer holds an ``LLM``, an ``AsyncLLM``, a ``VllmConfig`` or a
``ModelConfig``; the facts live on the ``ModelConfig``. The objects are read by
attribute (duck-typed), so the adapter imports no vLLM module to find them and
works the same on every vLLM version that keeps these attribute names.
"""

from __future__ import annotations

__all__ = [
    "is_kv_consumer",
    "is_multimodal_model",
    "kv_connector_of",
    "model_config_of",
    "multimodal_config",
]


def model_config_of(source: object) -> object:
    """The ``ModelConfig`` behind ``source``.

    ``source`` is an ``LLM`` (``llm.llm_engine.vllm_config.model_config``), an
    engine such as ``AsyncLLM`` or ``LLMEngine`` (``engine.vllm_config.model_config``),
    a ``VllmConfig`` (``vllm_config.model_config``) or a ``ModelConfig`` itself
    (recognised by its ``multimodal_config`` attribute).

    Raises ``TypeError`` for anything else: that is a programming error, not a
    fact about an engine.
    """
    node = source
    for hop in ("llm_engine", "vllm_config", "model_config"):
        # Each hop is optional: a caller may hold the object at any level of the chain.
        inner = getattr(node, hop, None)
        if inner is not None:
            node = inner
    if not hasattr(node, "multimodal_config"):
        raise TypeError(
            f"expected a vLLM LLM, AsyncLLM, VllmConfig or ModelConfig, not {type(source).__name__}"
        )
    return node


def multimodal_config(model_config: object) -> object | None:
    """The model's ``MultiModalConfig``, or ``None`` for a text-only architecture."""
    return getattr(model_config, "multimodal_config", None)


def is_multimodal_model(model_config: object) -> bool:
    """Whether the architecture is multimodal, whatever the engine's flags.

    vLLM's own ``is_multimodal_model`` is ``multimodal_config is not None`` on
    every version that has it, and stays true under ``--language-model-only``.
    """
    answer = getattr(model_config, "is_multimodal_model", None)
    if answer is None:
        return multimodal_config(model_config) is not None
    return bool(answer)


def is_kv_consumer(source: object) -> bool:
    """Whether the engine behind ``source`` takes KV from a connector.

    vLLM's ``KVTransferConfig.is_kv_consumer``: a connector is set and the role
    is ``kv_consumer`` or ``kv_both``. It lives on the ``VllmConfig``, so a bare
    ``ModelConfig`` (which does not know the engine's role) answers false.
    """
    node = source
    for hop in ("llm_engine", "vllm_config"):
        inner = getattr(node, hop, None)
        if inner is not None:
            node = inner
    kv_config = getattr(node, "kv_transfer_config", None)
    return bool(getattr(kv_config, "is_kv_consumer", False))


def kv_connector_of(source: object) -> str:
    """The KV connector class the engine behind ``source`` names
    (``kv_transfer_config.kv_connector``), ``""`` when it has none or ``source`` is a
    bare ``ModelConfig``."""
    node = source
    for hop in ("llm_engine", "vllm_config"):
        inner = getattr(node, hop, None)
        if inner is not None:
            node = inner
    name = getattr(getattr(node, "kv_transfer_config", None), "kv_connector", None)
    return name if isinstance(name, str) else ""

"""pd-policy on a live vLLM engine: the worker side of the P/D contract.

- [`engine_facts`][pd_policy_vllm.facts.engine_facts] reads what the core's capability rule needs
  from a vLLM
  ``LLM``, ``AsyncLLM``, ``VllmConfig`` or ``ModelConfig``, on vLLM 0.30 and
  earlier (the registry check) as on 0.31 and later (the property);
  [`supports_vision`][pd_policy_vllm.vision.supports_vision] and
  [`media_processor_advert`][pd_policy_vllm.vision.media_processor_advert] are the answers a
  servicer reports.
- [`decode_inputs`][pd_policy_vllm.prompt.decode_inputs] turns a decode leg into the engine input: a
  ``TokensPrompt`` of the prefill-expanded ids with the folded ``cache_salt``,
  and a copy of the sampling parameters carrying the KV handoff. For an engine
  without a vision encoder it runs the core's guard first.
  [`DecodeEngine`][pd_policy_vllm.engine.DecodeEngine] does both for a live ``LLM``.

Importing this package does not import vLLM; the functions do, when they need it.
Without it, [`decode_inputs`][pd_policy_vllm.prompt.decode_inputs] and
[`supported_modalities`][pd_policy_vllm.limits.supported_modalities] raise
``ModuleNotFoundError`` naming the extra to install: ``pd-policy[vllm]``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from .encoder_cache import EC_CONNECTOR, ec_transfer_config, encoder_cache_role
from .engine import DecodeEngine, generate_one
from .facts import engine_facts
from .limits import modality_limits, supported_modalities
from .model_config import model_config_of
from .probe import probe_mm_inputs
from .prompt import KV_TRANSFER_PARAMS_KEY, DecodeInputs, decode_inputs, kv_transfer_params
from .vision import accepts_mm_metadata, media_processor_advert, supports_vision

_P = ParamSpec("_P")
_R = TypeVar("_R")

# What these functions import when called: vLLM, and torch and transformers with it.
_VLLM_MODULES = frozenset({"vllm", "torch", "transformers"})


def _needs_vllm(function: Callable[_P, _R]) -> Callable[_P, _R]:
    """``function``, whose missing vLLM is a ``ModuleNotFoundError`` naming the extra."""

    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return function(*args, **kwargs)
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] not in _VLLM_MODULES:
                raise
            raise ModuleNotFoundError(
                f"{function.__name__} needs vLLM ({exc.name} is missing): "
                "pip install 'pd-policy[vllm]'",
                name=exc.name,
            ) from exc

    return call


# Rebound through globals(), so the docs and type checkers keep seeing the functions themselves.
for _name in ("decode_inputs", "supported_modalities"):
    globals()[_name] = _needs_vllm(globals()[_name])
del _name

__all__ = [
    "EC_CONNECTOR",
    "KV_TRANSFER_PARAMS_KEY",
    "DecodeEngine",
    "DecodeInputs",
    "accepts_mm_metadata",
    "decode_inputs",
    "ec_transfer_config",
    "encoder_cache_role",
    "engine_facts",
    "generate_one",
    "kv_transfer_params",
    "media_processor_advert",
    "modality_limits",
    "model_config_of",
    "probe_mm_inputs",
    "supported_modalities",
    "supports_vision",
]

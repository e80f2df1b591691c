"""pd-policy on a live vLLM engine: the worker side of the P/D contract.

- :func:`engine_facts` reads what the core's capability rule needs from a vLLM
  ``LLM``, ``AsyncLLM``, ``VllmConfig`` or ``ModelConfig``, on vLLM 0.30 and
  earlier (the registry check) as on 0.31 and later (the property);
  :func:`supports_vision` and :func:`media_processor_advert` are the answers a
  servicer reports.
- :func:`decode_inputs` turns a decode leg into the engine input: a
  ``TokensPrompt`` of the prefill-expanded ids with the folded ``cache_salt``,
  and a copy of the sampling parameters carrying the KV handoff. For an engine
  without a vision encoder it runs the core's guard first.
  :class:`DecodeEngine` does both for a live ``LLM``.

Importing this package does not import vLLM; the functions do, when they need it.
"""

from __future__ import annotations

from .engine import DecodeEngine, generate_one
from .facts import engine_facts
from .limits import modality_limits, supported_modalities
from .model_config import model_config_of
from .probe import probe_mm_inputs
from .prompt import KV_TRANSFER_PARAMS_KEY, DecodeInputs, decode_inputs, kv_transfer_params
from .vision import accepts_mm_metadata, media_processor_advert, supports_vision

__all__ = [
    "KV_TRANSFER_PARAMS_KEY",
    "DecodeEngine",
    "DecodeInputs",
    "accepts_mm_metadata",
    "decode_inputs",
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

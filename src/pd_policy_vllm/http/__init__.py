"""The policy over vLLM's OpenAI-compatible HTTP server, and a P/D proxy users run.

- [`request`][pd_policy_vllm.http.request], [`media`][pd_policy_vllm.http.media],
  [`legs`][pd_policy_vllm.http.legs]: pure shaping of request and response
  bodies, for any proxy to call (no I/O).
- [`workers`][pd_policy_vllm.http.workers]: what a worker's server says about it.
- [`proxy`][pd_policy_vllm.http.proxy] and ``pd-policy-proxy``
  ([`cli`][pd_policy_vllm.http.cli]): the proxy, on ``aiohttp``.

Install with the ``http`` extra. Importing the shaping modules needs no
``aiohttp``; the proxy and the CLI do.
"""

from __future__ import annotations

from .legs import Leg, PrefillReply, decode_body, prefill_body, read_prefill
from .media import TEXT_PART_TYPES, MediaPart, media_parts, without_media
from .plan import Plan, decode_leg, plan_request
from .request import CACHE_SALT_LIMIT, Route, check_cache_salt, policy_request
from .workers import (
    HttpWorker,
    capability_from_config,
    engine_facts_from_config,
    prefill_kv_from_config,
)

__all__ = [
    "CACHE_SALT_LIMIT",
    "TEXT_PART_TYPES",
    "HttpWorker",
    "Leg",
    "MediaPart",
    "Plan",
    "PrefillReply",
    "Route",
    "capability_from_config",
    "check_cache_salt",
    "decode_body",
    "decode_leg",
    "engine_facts_from_config",
    "media_parts",
    "plan_request",
    "policy_request",
    "prefill_body",
    "prefill_kv_from_config",
    "read_prefill",
    "without_media",
]

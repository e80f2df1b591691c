"""The policy on vLLM's OpenAI-compatible bodies: pure shaping, no server, no I/O.

What a P/D router does to an OpenAI request between reading it and sending its legs,
as functions any router can call (the proxy, ``pd_policy_ray``, another gateway):

- [`wire`][pd_policy_vllm.openai.wire]: bodies as bytes. Reading a client's body within
  its limits, parsing it with its data URLs left in its bytes (``skim``), rewriting a
  few members of its bytes (``splice``), JSON in and out (``codec``), and token ids kept
  as the bytes a worker sent;
- [`media`][pd_policy_vllm.openai.media]: which parts of a chat body are media and what
  identifies each (its content, the client's uuid scoped to its tenant, or nothing
  reusable);
- [`plan`][pd_policy_vllm.openai.plan]: the request as the policy sees it, and the legs:
  the plan before prefill, the render and encode legs of the metadata path and E/P/D,
  the prefill leg, and the decode leg from the prefill's reply;
- [`workers`][pd_policy_vllm.openai.workers]: what a worker's configuration says it is.

Importing it loads no server: ``aiohttp`` is the proxy's
([`pd_policy_vllm.http`][pd_policy_vllm.http]). ``msgspec`` makes the JSON fast where it
is installed; the standard library gives the same results without it.
"""

from __future__ import annotations

from pd_policy_vllm.openai.media.parts import TEXT_PART_TYPES, MediaPart, media_parts, without_media
from pd_policy_vllm.openai.plan.legs import (
    Leg,
    PrefillReply,
    decode_body,
    prefill_body,
    read_prefill,
)
from pd_policy_vllm.openai.plan.request import (
    CACHE_SALT_LIMIT,
    Route,
    check_cache_salt,
    policy_request,
)
from pd_policy_vllm.openai.plan.steps import Plan, decode_leg, plan_request
from pd_policy_vllm.openai.workers import (
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

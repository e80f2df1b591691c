"""``pd-policy-proxy``: the P/D proxy users run in front of ``vllm serve`` workers, on
``aiohttp`` (the ``http`` extra).

- [`proxy`][pd_policy_vllm.http.proxy]: the server, its routes and its front door;
  [`driver`][pd_policy_vllm.http.driver] drives each request's
  [`Exchange`][pd_policy.exchange.machine.Exchange] with the I/O its actions ask for;
- [`upstream`][pd_policy_vllm.http.upstream.client]: the legs' client;
- [`fleet`][pd_policy_vllm.http.fleet.members]: the workers, their health, probes, placement,
  metrics and the admin routes;
- [`media`][pd_policy_vllm.http.media]: remote media fetched by the proxy;
- [`cli`][pd_policy_vllm.http.cli]: the command.

The shaping of the bodies is [`pd_policy_vllm.openai`][pd_policy_vllm.openai], which
imports no server. Its names are exported here too, where routers imported them before
it was a package of its own.
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

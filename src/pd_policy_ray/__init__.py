"""pd-policy inside Ray Serve LLM's prefill/decode: language-model-only decode replicas.

Ray Serve LLM's P/D sends its decode the client's request, images included, with the
prefill's KV parameters copied on, so its decode must be a full-vision engine. Here the
decode deployment is [`PolicyDecodeServer`][pd_policy_ray.server.PolicyDecodeServer]:
the policy decides both legs for the replica's own capability, so a
``language_model_only`` decode serves image requests from the prefill's KV, and the
carve-outs are OpenAI errors before any engine is called.

- [`build_pd_policy_app`][pd_policy_ray.builder.build_pd_policy_app]: the application, in
  place of Ray's ``build_pd_openai_app``.
- [`legs`][pd_policy_ray.legs], [`errors`][pd_policy_ray.errors]: the pure shaping and the
  error mapping (no Ray needed).
- [`capability`][pd_policy_ray.capability]: a replica's capability from its engine.
- [`PolicyPrefillServer`][pd_policy_ray.prefill.PolicyPrefillServer],
  [`metadata`][pd_policy_ray.metadata], [`scale_out`][pd_policy_ray.scale_out]: the
  M-RoPE metadata path (Qwen2-VL on a ``language_model_only`` decode): rendered and
  prefilled on the prefill replica, decoded and derendered on the decode's own engine.

Pinned to ``ray[serve]==2.60.0`` (the extra ``ray``): the seam is Ray's internal API.
Importing this package does not import Ray; ``build_pd_policy_app`` and
``PolicyDecodeServer`` do, when first used.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RAY_VERSION", "PolicyDecodeServer", "build_pd_policy_app"]

#: The Ray release this adapter is built and tested against (its seam is internal API).
RAY_VERSION = "2.60.0"


def __getattr__(name: str) -> Any:
    # Ray (and vLLM with it) is imported only when the adapter is used.
    if name == "build_pd_policy_app":
        from .builder import build_pd_policy_app

        return build_pd_policy_app
    if name == "PolicyDecodeServer":
        from .server import PolicyDecodeServer

        return PolicyDecodeServer
    raise AttributeError(name)

"""``build_pd_policy_app``: Ray Serve LLM's P/D application with the policy's decode server.

Ray's ``build_pd_openai_app`` hard-codes its decode server class; this builder is the
same graph (ingress -> decode -> prefill) from Ray's public builder pieces, with
[`PolicyDecodeServer`][pd_policy_ray.server.PolicyDecodeServer] as the decode deployment
and [`PolicyPrefillServer`][pd_policy_ray.prefill.PolicyPrefillServer] (which also renders,
for the M-RoPE metadata path) as the prefill one, or their data-parallel forms. Configs
are validated by Ray's own ``PDServingArgs`` (same model on both, a
``kv_transfer_config`` on both, LoRA on both or neither).
"""

from __future__ import annotations

from typing import Any

from .prefill import PolicyDPPrefillServer, PolicyPrefillServer
from .seam import (
    RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING,
    DPServer,
    PDServingArgs,
    _build_direct_streaming_llm_deployment,
    _build_openai_ingress_request_router,
    _validate_direct_streaming_ingress_config,
    build_dp_deployment,
    build_llm_deployment,
    make_fastapi_ingress,
    maybe_apply_llm_deployment_config_defaults,
    serve,
    to_model_metadata,
)
from .server import PolicyDecodeServer

__all__ = ["PolicyDPDecodeServer", "build_pd_policy_app"]


class PolicyDPDecodeServer(PolicyDecodeServer, DPServer):  # type: ignore[misc]
    """[`PolicyDecodeServer`][pd_policy_ray.server.PolicyDecodeServer] with Ray's
    data-parallel gang scheduling (as Ray's ``DPPDDecodeServer`` is)."""


def _dp_size(config: Any) -> int:
    return int(config.engine_kwargs.get("data_parallel_size", 1))


def build_pd_policy_app(
    prefill_config: Any,
    decode_config: Any,
    *,
    ingress_cls_config: dict[str, Any] | None = None,
    ingress_deployment_config: dict[str, Any] | None = None,
) -> Any:
    """The P/D application, for ``serve.run``: in place of Ray's
    ``build_pd_openai_app({"prefill_config": ..., "decode_config": ...})``.

    ``prefill_config`` and ``decode_config`` are ``LLMConfig`` objects, dicts or paths to
    YAML, as Ray takes them; the decode config may run ``language_model_only``. Raises
    what Ray's ``PDServingArgs`` raises for configs it refuses.
    """
    args: dict[str, Any] = {"prefill_config": prefill_config, "decode_config": decode_config}
    if ingress_cls_config is not None:
        args["ingress_cls_config"] = ingress_cls_config
    if ingress_deployment_config is not None:
        args["ingress_deployment_config"] = ingress_deployment_config
    pd = PDServingArgs.model_validate(args)
    prefill_dp, decode_dp = _dp_size(pd.prefill_config), _dp_size(pd.decode_config)
    prefill = (build_dp_deployment if prefill_dp > 1 else build_llm_deployment)(
        pd.prefill_config,
        name_prefix="Prefill:",
        deployment_cls=PolicyDPPrefillServer if prefill_dp > 1 else PolicyPrefillServer,
    )
    decode_cls = PolicyDPDecodeServer if decode_dp > 1 else PolicyDecodeServer
    bind = {"prefill_server": prefill}
    if RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING:
        _validate_direct_streaming_ingress_config(
            pd.ingress_deployment_config, pd.ingress_cls_config
        )
        decode = _build_direct_streaming_llm_deployment(
            pd.decode_config, name_prefix="Decode:", bind_kwargs=bind, deployment_cls=decode_cls
        )
        return decode._with_ingress_request_router(
            _build_openai_ingress_request_router(server=decode, llm_config=pd.decode_config)
        )
    decode = (build_dp_deployment if decode_dp > 1 else build_llm_deployment)(
        pd.decode_config, name_prefix="Decode:", bind_kwargs=bind, deployment_cls=decode_cls
    )
    ingress = pd.ingress_cls_config
    options = maybe_apply_llm_deployment_config_defaults(
        ingress.ingress_cls.get_deployment_options([pd.decode_config]),
        pd.ingress_deployment_config,
    )
    model_id = pd.decode_config.model_id
    lora = pd.decode_config.lora_config
    return serve.deployment(make_fastapi_ingress(ingress.ingress_cls), **options).bind(
        llm_deployments={model_id: decode},
        model_cards={model_id: to_model_metadata(model_id, pd.decode_config)},
        lora_paths={model_id: lora.dynamic_lora_loading_path} if lora is not None else {},
        **ingress.ingress_extra_kwargs,
    )

"""Every piece of Ray Serve LLM this adapter binds to, imported in one place.

They are Ray's internal API (``ray.llm._internal``), pinned at
[`RAY_VERSION`][pd_policy_ray.RAY_VERSION]: a Ray that moves one of them fails here, at
import, naming it, not in a request. A missing Ray is one ``ModuleNotFoundError`` that
names the extra to install.
"""

from __future__ import annotations

try:
    from ray import serve
    from ray.llm._internal.common.dict_utils import (
        maybe_apply_llm_deployment_config_defaults,
    )
    from ray.llm._internal.serve.constants import RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING
    from ray.llm._internal.serve.core.configs.openai_api_models import (
        ChatCompletionRequest,
        ChatCompletionResponse,
        CompletionRequest,
        ErrorInfo,
        ErrorResponse,
        to_model_metadata,
    )
    from ray.llm._internal.serve.core.ingress.builder import (
        _build_direct_streaming_llm_deployment,
        _build_openai_ingress_request_router,
        _validate_direct_streaming_ingress_config,
    )
    from ray.llm._internal.serve.core.ingress.ingress import make_fastapi_ingress
    from ray.llm._internal.serve.core.ingress.utils import _sanitize_chat_completion_request
    from ray.llm._internal.serve.core.server.builder import build_llm_deployment
    from ray.llm._internal.serve.core.server.llm_server import LLMServer
    from ray.llm._internal.serve.serving_patterns.data_parallel.builder import (
        build_dp_deployment,
    )
    from ray.llm._internal.serve.serving_patterns.data_parallel.dp_server import DPServer
    from ray.llm._internal.serve.serving_patterns.prefill_decode.builder import PDServingArgs
    from ray.llm._internal.serve.serving_patterns.prefill_decode.pd_server import (
        PDDecodeServer,
        PDPrefillServer,
    )
except ModuleNotFoundError as exc:
    raise ModuleNotFoundError(
        f"pd_policy_ray needs the ray extra ({exc.name} is missing): pip install 'pd-policy[ray]'",
        name=exc.name,
    ) from exc

__all__ = [
    "RAY_SERVE_LLM_ENABLE_DIRECT_STREAMING",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "CompletionRequest",
    "DPServer",
    "ErrorInfo",
    "ErrorResponse",
    "LLMServer",
    "PDDecodeServer",
    "PDPrefillServer",
    "PDServingArgs",
    "_build_direct_streaming_llm_deployment",
    "_build_openai_ingress_request_router",
    "_sanitize_chat_completion_request",
    "_validate_direct_streaming_ingress_config",
    "build_dp_deployment",
    "build_llm_deployment",
    "make_fastapi_ingress",
    "maybe_apply_llm_deployment_config_defaults",
    "serve",
    "to_model_metadata",
]

"""The decode server that runs Ray Serve LLM's P/D with the policy's legs.

[`PolicyDecodeServer`][pd_policy_ray.server.PolicyDecodeServer] is Ray's
``PDDecodeServer`` (the decode deployment owns an engine and drives the remote prefill)
with the request's life replaced by the policy's: an
[`Exchange`][pd_policy.exchange.machine.Exchange] of one attempt
([`driver`][pd_policy_ray.driver]), as every router of this library runs. The policy
plans both legs for the replica's own capability ([`legs`][pd_policy_ray.legs]), a
refusal is an OpenAI error before any engine is called, the prefill runs on the prefill
deployment, the handoff is checked, and the decode leg the policy built runs on the
local engine. Ray's connector backend still sets the engine up (NIXL's
side channel, say); the backend's request shaping is not used. An M-RoPE image on a
replica that takes metadata runs the metadata path ([`metadata`][pd_policy_ray.metadata]):
rendered and prefilled on the prefill deployment
([`PolicyPrefillServer`][pd_policy_ray.prefill.PolicyPrefillServer]), decoded token-in
on the local engine and derendered there.

Imports Ray Serve LLM (``pd-policy[ray]``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from pd_policy import InvalidConfiguration, Support, WorkerCapability
from pd_policy_vllm.openai.plan.request import Route

from .capability import engine_config_of, replica_capability, uses_mrope
from .driver import serve
from .legs import prefill_kv
from .scale_out import ScaleOut
from .seam import (
    ChatCompletionRequest,
    CompletionRequest,
    LLMServer,
    PDDecodeServer,
    _sanitize_chat_completion_request,
)
from .tracing import traced_info

__all__ = ["PolicyDecodeServer", "requests_log"]

#: One JSON line a request (its id, the client's, route, decode form and outcome), under
#: ``ray.serve`` so that Serve's formatter tags it with the replica's id (it reaches the
#: replica worker's stderr log, ``worker-*.err``, as measured on Ray 2.60).
requests_log = logging.getLogger("ray.serve.pd_policy")
#: How much of a client's own request id the log line keeps.
_CLIENT_ID_CHARS = 128


def _route(request: Any) -> Route:
    if isinstance(request, ChatCompletionRequest):
        return Route.CHAT
    if isinstance(request, CompletionRequest):
        return Route.COMPLETIONS
    raise TypeError(f"no P/D route for {type(request).__name__}")


def _request(route: Route, body: dict[str, Any]) -> Any:
    # A request rebuilt from a dict holds pydantic iterators that cannot be pickled
    # across a Serve handle until sanitised, as Ray's own ingress does.
    if route is Route.CHAT:
        return _sanitize_chat_completion_request(ChatCompletionRequest.model_validate(body))
    return CompletionRequest.model_validate(body)


class PolicyDecodeServer(PDDecodeServer):  # type: ignore[misc]
    """Ray's P/D decode server with the legs the policy decides.

    Its capability is its own engine's ([`replica_capability`][
    pd_policy_ray.capability.replica_capability]), read once the engine has started.
    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] at start for
    a connector whose contract the core does not know, and for a Ray connector backend
    that binds its peer or hands off concurrently (the policy builds the decode leg from
    the prefill's reply, so it needs the sequential handoff).
    """

    capability: WorkerCapability

    # Ray Serve awaits an async __init__ (LLMServer's is one).
    async def __init__(self, llm_config: Any, **kwargs: Any) -> None:  # type: ignore[misc]
        await super().__init__(llm_config, **kwargs)
        backend = self._get_connector_backend()
        if backend.requires_peer_binding or backend.concurrent_handoff:
            raise InvalidConfiguration(
                f"{type(backend).__name__} binds its peer or hands off concurrently; the "
                "policy needs the prefill's reply before decode (a sequential connector)"
            )
        config = engine_config_of(self.engine)
        self.capability = replica_capability(config)
        self.mrope = uses_mrope(config)
        self.kv = prefill_kv(llm_config.engine_kwargs.get("kv_transfer_config"))
        # The metadata path's engine calls (render, prefill) are unary, not streamed.
        self.prefill_calls = self._prefill_handle.options(stream=False)
        self.local: ScaleOut | None = None
        if self.capability.accepts_mm_metadata is Support.TRUE and self.mrope:
            self.local = ScaleOut.of(self.engine)
        requests_log.info(
            "decode replica: supports_vision=%s accepts_mm_metadata=%s mrope=%s kv=%s",
            self.capability.supports_vision.name,
            self.capability.accepts_mm_metadata.name,
            self.mrope,
            self.kv.mode.name,
        )

    async def _pd_handle_request(
        self, request: Any, raw_request_info: Any = None
    ) -> AsyncGenerator[Any, None]:
        route = _route(request)
        body = request.model_dump(mode="json", exclude_unset=True)
        # Every leg runs under the server's own id, unique per request: two clients that
        # chose one id would collide on one engine (the driver drops the client's).
        request_id = f"pd-{uuid.uuid4().hex}"
        client_id = body.get("request_id")
        client_id = client_id[:_CLIENT_ID_CHARS] if isinstance(client_id, str) else None

        def log(form: str, outcome: str, status: int, extra: dict[str, int]) -> None:
            line = {
                "request_id": request_id,
                "client_request_id": client_id,
                "route": route.value,
                "form": form,
                "outcome": outcome,
                "status": status,
                **extra,
            }
            requests_log.info(json.dumps(line, separators=(",", ":")))

        # Both legs carry the client's trace context, checked (see tracing).
        served = serve(self, route, body, request_id, traced_info(raw_request_info), log)
        async with contextlib.aclosing(served):  # a client that leaves closes every leg
            async for item in served:
                yield item

    async def prefill(self, route: Route, body: dict[str, Any], raw_request_info: Any) -> Any:
        """The prefill deployment's first answer to ``body``: its one token, or an
        ``ErrorResponse``."""
        handle = getattr(self._prefill_handle, route.name.lower())
        responses = handle.remote(_request(route, body), raw_request_info)
        try:
            first = await responses.__anext__()
            async for _ in responses:  # drained, so that the handle's accounting ends
                pass
        except BaseException:
            # The client left (or the call failed): Ray's handle does not cancel a call
            # whose awaiting task is cancelled, and the prefill replica would run it for no
            # one (or hold its place in the queue).
            responses.cancel()
            raise
        return first[0] if isinstance(first, list) else first

    async def decode(
        self, route: Route, body: dict[str, Any], raw_request_info: Any
    ) -> AsyncIterator[Any]:
        """The local engine's answer to the decode ``body``, through Ray's own request
        pipeline (request id, LoRA, batching); its refusal is its first chunk."""
        method = LLMServer.chat if route is Route.CHAT else LLMServer.completions
        # Closed with this stream: the engine's request ends as the client leaves.
        async with contextlib.aclosing(
            await method(self, _request(route, body), raw_request_info)
        ) as chunks:
            async for chunk in chunks:
                yield chunk

"""The decode server that runs Ray Serve LLM's P/D with the policy's legs.

[`PolicyDecodeServer`][pd_policy_ray.server.PolicyDecodeServer] is Ray's
``PDDecodeServer`` (the decode deployment owns an engine and drives the remote prefill)
with the request's life replaced: the policy plans both legs for the replica's own
capability ([`legs`][pd_policy_ray.legs]), a refusal is an OpenAI error before any engine
is called, the prefill runs on the prefill deployment, and the decode leg the policy
built runs on the local engine. Ray's connector backend still sets the engine up (NIXL's
side channel, say); the backend's request shaping is not used. An M-RoPE image on a
replica that takes metadata runs the metadata path ([`metadata`][pd_policy_ray.metadata]):
rendered and prefilled on the prefill deployment
([`PolicyPrefillServer`][pd_policy_ray.prefill.PolicyPrefillServer]), decoded token-in
on the local engine and derendered there.

Imports Ray Serve LLM (``pd-policy[ray]``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncGenerator
from typing import Any

from pd_policy import InvalidConfiguration, PolicyError, Support, WorkerCapability
from pd_policy_vllm.http.request import Route

from .capability import engine_config_of, replica_capability, uses_mrope
from .errors import error_response
from .legs import decode_body_for, plan_legs, prefill_body_for, prefill_kv
from .metadata import Step, decode_metadata_leg, prepare_metadata_leg
from .scale_out import ScaleOut
from .seam import (
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    LLMServer,
    PDDecodeServer,
    _sanitize_chat_completion_request,
)

__all__ = ["PolicyDecodeServer", "requests_log"]

#: One JSON line a request (its id, route, decode form and outcome), under ``ray.serve``
#: so that Serve's formatter tags it with the replica's id (it reaches the replica
#: worker's stderr log, ``worker-*.err``, as measured on Ray 2.60).
requests_log = logging.getLogger("ray.serve.pd_policy")


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
            self.capability.supports_vision.name, self.capability.accepts_mm_metadata.name,
            self.mrope, self.kv.mode.name,
        )  # fmt: skip

    async def _pd_handle_request(
        self, request: Any, raw_request_info: Any = None
    ) -> AsyncGenerator[Any, None]:
        route = _route(request)
        request_id = getattr(request, "request_id", None) or f"pd-{uuid.uuid4().hex}"
        body = request.model_dump(mode="json", exclude_unset=True)
        form = "-"
        try:
            plan = plan_legs(body, route, self.capability, self.kv, mrope=self.mrope,
                             request_id=request_id)  # fmt: skip
            form = plan.form.value
            if plan.render is not None:
                async for item in self._metadata(plan, request_id, route, form):
                    yield item
                return
            prefill_body = prefill_body_for(plan)
            if prefill_body is None:  # n>1 without media: decode runs alone
                decode = _request(route, decode_body_for(plan, None))
            else:
                reply = await self._prefill(route, _request(route, prefill_body), raw_request_info)
                if isinstance(reply, ErrorResponse):
                    self._log(request_id, route, form, "prefill_error", reply.error.code)
                    yield reply
                    return
                decode = _request(route, decode_body_for(plan, reply.model_dump(mode="json")))
        except PolicyError as exc:
            self._log(request_id, route, form, exc.code, exc.status)
            yield error_response(exc)
            return
        first = True
        async for chunk in self._decode(route, decode, raw_request_info):
            if first:  # the decode's own refusal arrives as its first chunk (or batch)
                head = chunk[0] if isinstance(chunk, list) and chunk else chunk
                failed = isinstance(head, ErrorResponse)
                self._log(request_id, route, form, "decode_error" if failed else "ok",
                          head.error.code if failed else 200)  # fmt: skip
                first = False
            yield chunk

    async def _metadata(
        self, plan: Any, request_id: str, route: Route, form: str
    ) -> AsyncGenerator[Any, None]:
        # Raises the core's refusals after prefill (the caller answers them).
        step, leg = await prepare_metadata_leg(plan, self.prefill_calls)
        if step is not Step.DECODE:
            self._log(request_id, route, form, f"{step.value}_error", leg.error.code)
            yield leg
            return
        if self.local is None:  # a plan says the path exists only where it does
            raise InvalidConfiguration("this replica has no scale-out serving")
        # What the decode engine was sent: the grids, never the pixels (the live tests read it).
        sent = len(json.dumps(leg.body, separators=(",", ":")))
        first = True
        async for step, item in decode_metadata_leg(leg, self.local):
            if first:  # one line a request, as on the plain path: its first answer
                failed = isinstance(item, ErrorResponse)
                outcome = f"{step.value}_error" if failed else "ok"
                self._log(request_id, route, form, outcome, item.error.code if failed else 200,
                          decode_bytes=sent)  # fmt: skip
                first = False
            yield item

    async def _prefill(self, route: Route, request: Any, raw_request_info: Any) -> Any:
        # The prefill deployment's first answer: its one token, or an ErrorResponse.
        handle = getattr(self._prefill_handle, route.name.lower())
        responses = handle.remote(request, raw_request_info)
        first = await responses.__anext__()
        async for _ in responses:  # drained, so that the handle's accounting ends
            pass
        return first[0] if isinstance(first, list) else first

    def _log(
        self, request_id: str, route: Route, form: str, outcome: str, status: int, **extra: int
    ) -> None:
        line = {"request_id": request_id, "route": route.value, "form": form,
                "outcome": outcome, "status": status, **extra}  # fmt: skip
        requests_log.info(json.dumps(line, separators=(",", ":")))

    async def _decode(
        self, route: Route, request: Any, raw_request_info: Any
    ) -> AsyncGenerator[Any, None]:
        # The local engine, through Ray's own request pipeline (request id, LoRA, batching).
        method = LLMServer.chat if route is Route.CHAT else LLMServer.completions
        async for chunk in await method(self, request, raw_request_info):
            yield chunk

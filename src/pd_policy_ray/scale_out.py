"""A Ray replica's own vLLM scale-out serving: render, generate, derender, in process.

The M-RoPE metadata path (see [`scale_out`][pd_policy_vllm.openai.plan.scale_out] for the HTTP
proxy's) needs, for a chat request, the prefill engine's render (the expanded ids and,
per image, its hash, placeholder and grid), a token-in generate on both engines, and
the decode engine's derender of its tokens into the client's chat completion. Ray
Serve LLM serves none of these routes, but every replica's engine builds their serving
objects: Ray's ``VLLMEngine.start`` runs vLLM's ``init_app_state``, which makes
``serving_render``, ``serving_tokens`` and ``serving_derender`` for any engine that
generates (vLLM 0.32). [`ScaleOut`][pd_policy_ray.scale_out.ScaleOut] calls them
directly, with the same request models the HTTP routes validate.

Bodies go in and come out as JSON-shaped dicts (what the HTTP routes send), so the
legs the policy built for the HTTP proxy run here unchanged. A vLLM ``ErrorResponse``
comes back as Ray's (the class Ray's ingress recognises), its status kept.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs

from pd_policy import InvalidConfiguration

__all__ = ["ScaleOut", "ray_error"]

_DATA = "data: "


def ray_error(error: Any) -> Any:
    """vLLM's ``ErrorResponse`` as Ray's, which Ray's ingress turns into the HTTP error."""
    from .seam import ErrorInfo, ErrorResponse

    if isinstance(error, ErrorResponse):
        return error
    return ErrorResponse(error=ErrorInfo(**error.error.model_dump()))


def _streamed_error(event: Mapping[str, Any]) -> Any:
    # vLLM's generate stream reports a failure as an event of its own ({"error": {...}}).
    from .seam import ErrorInfo, ErrorResponse

    error = event["error"]
    fields = error if isinstance(error, Mapping) else {"message": str(error)}
    return ErrorResponse(
        error=ErrorInfo(
            message=str(fields.get("message", "the decode engine failed")),
            type=str(fields.get("type", "InternalServerError")),
            param=fields.get("param"),
            code=int(fields.get("code") or 500),
        )
    )


@attrs.frozen
class ScaleOut:
    """The three scale-out serving objects of one replica's engine."""

    render: Any
    tokens: Any
    derender: Any

    @classmethod
    def of(cls, engine: Any) -> ScaleOut:
        """Those of a Ray LLM server's engine (its ``VLLMEngine``). Raises
        [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] when the engine
        built none (not started, not generating, or a vLLM without scale-out serving)."""
        state = getattr(engine, "_app_state", None)
        parts = [
            getattr(state, name, None)
            for name in ("serving_render", "serving_tokens", "serving_derender")
        ]
        if any(part is None for part in parts):
            raise InvalidConfiguration(
                "the replica's engine has no scale-out serving (render, generate, "
                "derender): the M-RoPE metadata path needs vLLM 0.32's"
            )
        return cls(*parts)

    async def render_chat(self, body: Mapping[str, Any]) -> dict[str, Any] | Any:
        """The render of a chat request body (vLLM's ``GenerateRequest``, as JSON), or
        Ray's ``ErrorResponse``."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        result = await self.render.render_chat_request(ChatCompletionRequest.model_validate(body))
        return _plain_or_error(result)

    async def generate(self, body: Mapping[str, Any]) -> dict[str, Any] | Any:
        """A whole (non-streamed) token-in generate, as JSON, or Ray's ``ErrorResponse``."""
        result = await self._serve(body)
        if isinstance(result, AsyncIterator):  # asked to stream: a caller's mistake
            raise ValueError("generate() runs a non-streaming body; use generate_stream()")
        return _plain_or_error(result)

    async def generate_stream(self, body: Mapping[str, Any]) -> AsyncIterator[dict[str, Any] | Any]:
        """A streamed generate's events, parsed, up to ``[DONE]``; a refusal or a failure
        is Ray's ``ErrorResponse``, and the last item."""
        result = await self._serve(body)
        if not isinstance(result, AsyncIterator):
            yield _plain_or_error(result)
            return
        async for line in result:
            for event in line.split("\n\n"):
                if not event.startswith(_DATA):
                    continue
                data = event[len(_DATA) :]
                if data == "[DONE]":
                    return
                parsed = json.loads(data)
                if isinstance(parsed, dict) and "error" in parsed:
                    yield _streamed_error(parsed)
                    return
                yield parsed

    async def derender_whole(self, body: Mapping[str, Any]) -> dict[str, Any] | Any:
        """The chat completion of a whole generate response (a ``DerenderChatRequest``)."""
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import DerenderChatRequest

        request = DerenderChatRequest.model_validate(body)
        result = await self.derender.derender_chat_response(request)
        return _plain_or_error(result)

    async def derender_chunk(self, body: Mapping[str, Any]) -> tuple[Any, Any] | Any:
        """One streamed chunk's chat chunk and the state for the next call (JSON), from a
        ``DerenderChatStreamRequest``; or Ray's ``ErrorResponse``."""
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import (
            DerenderChatStreamRequest,
        )

        request = DerenderChatStreamRequest.model_validate(body)
        result = await self.derender.derender_chat_stream_response(request)
        if _is_error(result):
            return ray_error(result)
        chunk, state = result
        return chunk.model_dump(mode="json"), state.model_dump(mode="json")

    async def _serve(self, body: Mapping[str, Any]) -> Any:
        from vllm.entrypoints.scale_out.token_in_token_out.protocol import GenerateRequest

        return await self.tokens.serve_tokens(GenerateRequest.model_validate(body), None)


def _is_error(result: Any) -> bool:
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    return isinstance(result, ErrorResponse)


def _plain_or_error(result: Any) -> dict[str, Any] | Any:
    if _is_error(result):
        return ray_error(result)
    dumped: dict[str, Any] = result.model_dump(mode="json")
    return dumped

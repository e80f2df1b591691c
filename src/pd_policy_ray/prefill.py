"""The prefill server of the policy's Ray P/D: Ray's ``PDPrefillServer`` that also renders.

The M-RoPE metadata path starts on the prefill replica, which has the vision
processor: it renders the client's chat request (the expanded ids and, per image,
its hash, placeholder range and grid), and then runs the rendered request, pixels and
all, as the token-in prefill leg. Both are methods here, called by the decode server
through the prefill deployment's handle; Ray's own chat and completions stay as they
are for every other request.

Imports Ray Serve LLM (``pd-policy[ray]``).
"""

from __future__ import annotations

from typing import Any

from .scale_out import ScaleOut
from .seam import DPServer, PDPrefillServer

__all__ = ["PolicyDPPrefillServer", "PolicyPrefillServer"]


class PolicyPrefillServer(PDPrefillServer):  # type: ignore[misc]
    """Ray's P/D prefill server with the render and the token-in prefill of the metadata
    path. Each returns the JSON vLLM's route would, or Ray's ``ErrorResponse``; each
    raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] when the
    engine has no scale-out serving."""

    async def render_chat(self, body: dict[str, Any]) -> Any:
        """vLLM's render of the chat request ``body`` (a ``GenerateRequest``)."""
        return await ScaleOut.of(self.engine).render_chat(body)

    async def generate(self, body: dict[str, Any]) -> Any:
        """The token-in prefill of a rendered request ``body`` (not streamed)."""
        return await ScaleOut.of(self.engine).generate(body)


class PolicyDPPrefillServer(PolicyPrefillServer, DPServer):  # type: ignore[misc]
    """[`PolicyPrefillServer`][pd_policy_ray.prefill.PolicyPrefillServer] with Ray's
    data-parallel gang scheduling (as Ray's ``DPPDPrefillServer`` is)."""

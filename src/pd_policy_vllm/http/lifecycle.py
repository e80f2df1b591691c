"""The proxy's life as an orchestrator sees it: liveness, readiness and the drain.

- ``GET /health`` is liveness: 200 while the process serves, draining included (a
  process that is stopping is not to be restarted).
- ``GET /ready`` is readiness: 200 when the proxy could route a request now (at least one
  routable prefill and decode, not draining), else 503; the body says why not, and how
  many decode workers nothing described (taken as language-model-only).
- On SIGTERM ([`serving`][pd_policy_vllm.http.serving]) ``/ready`` turns 503 at once, new
  requests are still served for ``--pre-stop-seconds`` (while the balancer takes the
  proxy out), then the listener closes and the requests in flight get
  ``--drain-seconds`` to finish. With the defaults (5 and 20) the whole stop fits
  Kubernetes' 30 s grace.

Neither route asks for a key: a kubelet's probe carries none, and neither says more than
the fleet's health (no worker's address, no key).
"""

from __future__ import annotations

from typing import Final

from pd_policy.fleet.readiness import readiness
from pd_policy_vllm.http.aio import web
from pd_policy_vllm.http.fleet.members import Fleet

__all__ = ["DRAIN_SECONDS", "PRE_STOP_SECONDS", "Lifecycle"]

#: How long the requests in flight may take to finish once the listener closed.
DRAIN_SECONDS: Final = 20.0
#: How long new requests are still served after SIGTERM, with ``/ready`` already 503.
PRE_STOP_SECONDS: Final = 5.0


class Lifecycle:
    """Whether the proxy is stopping, and its two probe routes over ``fleet``."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.draining = False

    def routes(self, app: web.Application) -> None:
        """Add ``/health`` and ``/ready`` to ``app``."""
        app.router.add_get("/health", self.health)
        app.router.add_get("/ready", self.ready)

    async def health(self, request: web.Request) -> web.Response:
        """Liveness: the process serves."""
        return web.json_response({"status": "draining" if self.draining else "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        """Readiness: 200 ``{"ready": true}``, or 503 with ``why_not``;
        ``assumed_language_model_only`` counts the decode workers taken as
        language-model-only because nothing described them (the log names them: this
        route is open, and says no address)."""
        state = readiness(self.fleet, draining=self.draining)
        assumed = sum(1 for m in self.fleet.of("decode") if m.worker.assumed)
        body: dict[str, object] = {"ready": state.ready, "why_not": list(state.why_not)}
        if assumed:
            body["assumed_language_model_only"] = assumed
        return web.json_response(body, status=200 if state.ready else 503)

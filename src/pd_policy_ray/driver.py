"""One request through the Ray decode server: its [`Exchange`][pd_policy.exchange.machine.Exchange]
driven with the calls each action asks for, yielding what Ray's ingress sends the client.

The graph is one pair (the prefill deployment and this replica), so the exchange has one
attempt and no roster: Ray's router chose the replicas. Its actions are the request's
life: plan the legs for this replica's capability, render on the prefill replica (the
M-RoPE metadata path), prefill there, check the handoff, decode on the local engine. An
error a replica answers (Ray's ``ErrorResponse``) reaches the client as it came; the
policy's own refusals and failures are OpenAI errors of their own
([`error_response`][pd_policy_ray.errors.error_response]).

The plan starts by checking the client's body for the fields only the router may set
([`check_client_fields`][pd_policy.router_fields.check_client_fields]): a refused one is
the 400 before any leg; a client's ``request_id`` is dropped (and logged). Every leg's
body names the server's own id (``request_id``), so that Ray's pipeline runs it under
that id rather than stamping the Serve request id, which a client chooses with its
``X-Request-Id`` header. A client that leaves ends what it started: a prefill or render
call still out is cancelled on its handle (Ray's handle does not cancel a call whose
awaiting task is cancelled), and the decode's stream is closed before the client's is.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any, Protocol

import attrs

from pd_policy import (
    InvalidConfiguration,
    PolicyError,
    PrefillKv,
    Request,
    WorkerCapability,
    WorkerFailedToStart,
    check_client_fields,
)
from pd_policy.exchange import one_pair, settle
from pd_policy.exchange.events import (
    Begin,
    Event,
    Finish,
    FirstByte,
    Leg,
    LegAnswered,
    LegFailed,
    Plan,
    PlanFailed,
    Relay,
    Send,
)
from pd_policy.router_fields import without_dropped
from pd_policy_vllm.openai.plan.events import kv_facts, planned
from pd_policy_vllm.openai.plan.legs import PrefillReply
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.steps import Plan as LegsPlan
from pd_policy_vllm.openai.plan.steps import after_prefill, handed_over

from .errors import error_response
from .legs import plain_leg, plan_legs, prefill_body_for, rendered_plan
from .metadata import Step, decode_metadata_leg
from .scale_out import ScaleOut

__all__ = ["Replica", "serve"]

_log = logging.getLogger("ray.serve.pd_policy")


class Replica(Protocol):
    """What the decode server offers a request's life."""

    capability: WorkerCapability
    kv: PrefillKv
    mrope: bool
    prefill_calls: Any
    local: ScaleOut | None

    async def prefill(self, route: Route, body: dict[str, Any], raw_request_info: Any) -> Any:
        """The prefill deployment's answer to ``body``: its reply, or an ``ErrorResponse``."""
        ...

    def decode(
        self, route: Route, body: dict[str, Any], raw_request_info: Any
    ) -> AsyncIterator[Any]:
        """The local engine's answer to the decode ``body``, chunk by chunk."""
        ...


def _failed(item: Any) -> bool:
    from .seam import ErrorResponse

    head = item[0] if isinstance(item, list) and item else item
    return isinstance(head, ErrorResponse)


def _ours(body: Mapping[str, Any], request_id: str) -> dict[str, Any]:
    """A leg's ``body``, naming the server's own id for it."""
    return {**body, "request_id": request_id}


async def _answer(call: Any) -> Any:
    # A handle call's answer; the call cancelled on the handle when its caller leaves.
    try:
        return await call
    except BaseException:
        call.cancel()
        raise


def _worker_error(leg: str, answered: Any) -> WorkerFailedToStart:
    head = answered[0] if isinstance(answered, list) and answered else answered
    return WorkerFailedToStart(leg, detail=str(head.error.message), http_status=head.error.code)


class _Life:
    def __init__(
        self, replica: Replica, route: Route, body: dict[str, Any], request_id: str, raw: Any
    ) -> None:
        self.replica, self.route, self.body = replica, route, body
        self.request_id, self.raw = request_id, raw
        self.plan: LegsPlan[str] | None = None
        self.leg: Request | None = None
        self.reply: PrefillReply | None = None
        #: A replica's own error, which the client gets as it came.
        self.answered: Any = None

    def do_plan(self) -> Event:
        replica = self.replica
        try:
            dropped = check_client_fields(self.body)
            if dropped:
                self.body = without_dropped(self.body, dropped)
                _log.info(
                    "request %s: dropped the client's %s (the router sets its own)",
                    self.request_id,
                    ", ".join(field.name for field in dropped),
                )
            self.plan = plan_legs(
                self.body,
                self.route,
                replica.capability,
                replica.kv,
                mrope=replica.mrope,
                request_id=self.request_id,
            )
        except PolicyError as exc:
            return PlanFailed(exc)
        return planned(self.plan)

    async def send(self, leg: Leg) -> Event:
        plan, replica = self.plan, self.replica
        assert plan is not None
        try:
            if leg is Leg.RENDER:
                assert plan.render is not None  # a plan renders first only with one
                render = _ours(plan.render, self.request_id)
                answered = await _answer(replica.prefill_calls.render_chat.remote(render))
                if _failed(answered):
                    return self._refused(leg, answered)
                self.plan = rendered_plan(plan, answered)
                return LegAnswered(leg)
            prefill = prefill_body_for(plan)
            assert prefill is not None  # the plan runs a prefill
            body = _ours(prefill, self.request_id)
            if plan.rendered is not None:
                answered = await _answer(replica.prefill_calls.generate.remote(body))
            else:
                answered = await replica.prefill(self.route, body, self.raw)
            if _failed(answered):
                return self._refused(leg, answered)
            reply = answered if isinstance(answered, dict) else answered.model_dump(mode="json")
            self.reply, self.leg = after_prefill(plan, reply)
            return LegAnswered(leg, kv_facts(self.leg))
        except PolicyError as exc:
            return LegFailed(leg, exc)

    def _refused(self, leg: Leg, answered: Any) -> Event:
        self.answered = answered
        return LegFailed(leg, _worker_error("prefill", answered))

    def decode(self) -> AsyncIterator[Any]:
        plan, replica = self.plan, self.replica
        assert plan is not None
        leg = plain_leg(plan, self.leg or handed_over(plan, None), self.reply)
        body = _ours(leg.body, self.request_id)
        if leg.derender is None:
            return replica.decode(self.route, body, self.raw)
        if replica.local is None:  # a plan says the path exists only where it does
            raise InvalidConfiguration("this replica has no scale-out serving")
        return _items(decode_metadata_leg(attrs.evolve(leg, body=body), replica.local))

    @property
    def form(self) -> str:
        return self.plan.form.value if self.plan is not None else "-"

    def sent(self) -> int | None:
        # What the decode engine was sent on the metadata path: the grids, never the pixels
        # (the live tests read it).
        plan = self.plan
        if plan is None or plan.rendered is None or self.leg is None:
            return None
        leg = plain_leg(plan, self.leg, self.reply)
        return len(json.dumps(leg.body, separators=(",", ":")))


@contextlib.asynccontextmanager
async def _closing(stream: AsyncIterator[Any]) -> AsyncIterator[AsyncIterator[Any]]:
    # ``aclosing`` for a stream that may not be a generator (a replica's own iterator).
    try:
        yield stream
    finally:
        close = getattr(stream, "aclose", None)
        if close is not None:
            await close()


async def _items(steps: AsyncGenerator[tuple[Step, Any], None]) -> AsyncIterator[Any]:
    async with contextlib.aclosing(steps):
        async for _, item in steps:
            yield item


async def serve(
    replica: Replica,
    route: Route,
    body: dict[str, Any],
    request_id: str,
    raw_request_info: Any,
    log: Callable[[str, str, int, dict[str, int]], None],
) -> AsyncGenerator[Any, None]:
    """Serve one request on ``replica``: yields what the client gets. ``log`` is called once,
    with the outcome and status the client first saw (and, on the metadata path, the
    bytes of the decode leg), after the decode ``form``."""
    life = _Life(replica, route, body, request_id, raw_request_info)
    exchange = one_pair()
    action: Any = settle(None, exchange.handle(Begin()))
    logged = False
    while not isinstance(action, Finish):
        if isinstance(action, Plan):
            event = life.do_plan()
        elif isinstance(action, Send):
            event = await life.send(action.leg)
        else:
            assert isinstance(action, Relay)
            event = LegAnswered(Leg.DECODE)
            # Closed with the client's stream: the engine's request ends as the client leaves.
            async with _closing(life.decode()) as chunks:
                async for item in chunks:
                    if _failed(item):
                        if not exchange.seen:
                            life.answered = item
                        else:
                            yield item  # mid-stream, the stream's last event
                        event = LegFailed(Leg.DECODE, _worker_error("decode", item))
                        break
                    if not exchange.seen:
                        exchange.handle(FirstByte())
                        sent = life.sent()
                        extra = {"decode_bytes": sent} if sent is not None else {}
                        log(life.form, "ok", 200, extra)
                        logged = True
                    yield item
        action = settle(None, exchange.handle(event))
    if not logged:
        log(life.form, action.outcome, action.status, {})
    if action.error is not None and not action.late:
        yield life.answered if life.answered is not None else error_response(action.error)

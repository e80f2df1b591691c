"""One request through the proxy: its [`Exchange`][pd_policy.exchange.Exchange] driven with
the I/O each action asks for.

The loop is the whole of the request's life: the exchange says what to do (plan the
attempt on these members, send this leg to this member, relay the decode, finish), the
driver does it and reports what happened. Every rule (which member, in which order, when
to check the handoff, whom to blame, whether to try again, when nothing can be retried)
is the exchange's; the fleet's bookkeeping is applied by
[`settle`][pd_policy.exchange.settle]. A client that disconnects cancels the handler:
the exchange is told, the legs' connections close, and vLLM aborts what it was doing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from pd_policy import Placement, PolicyError, Request
from pd_policy.exchange import Exchange, settle
from pd_policy.exchange_events import (
    Begin,
    ClientLeft,
    DeadlinePassed,
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
from pd_policy_vllm.http.aio import web
from pd_policy_vllm.http.calls import post_json
from pd_policy_vllm.http.fleet.members import Fleet, Member
from pd_policy_vllm.http.fleet.metrics import Metrics
from pd_policy_vllm.http.fleet.routing import HttpPlacer
from pd_policy_vllm.http.front_door import Incoming, error_response
from pd_policy_vllm.http.planning import Planning
from pd_policy_vllm.http.relay import DecodeRelay
from pd_policy_vllm.http.request_log import log_request
from pd_policy_vllm.http.upstream import Upstream
from pd_policy_vllm.openai.plan.events import kv_facts, planned
from pd_policy_vllm.openai.plan.legs import PrefillReply, prefill_bytes
from pd_policy_vllm.openai.plan.scale_out import GENERATE, RENDER
from pd_policy_vllm.openai.plan.steps import (
    STRIPPED,
    decode_leg_of,
    handed_over,
    plan_encoded,
    plan_rendered,
    read_reply,
)
from pd_policy_vllm.openai.plan.steps import (
    Plan as LegsPlan,
)
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["Driver"]


class Driver:
    """The I/O of one admitted request (``incoming``, from the client ``request`` that
    arrived at ``arrived``, ``time.monotonic``) over ``fleet``: ``planning`` plans each
    attempt, ``upstream`` sends the legs with ``headers`` (the workers' key), ``attempts``
    is the budget and ``deadline`` the seconds the whole request may take (``None``: no
    limit). [`run`][pd_policy_vllm.http.driver.Driver.run] answers the client."""

    def __init__(
        self,
        fleet: Fleet,
        planning: Planning,
        upstream: Upstream,
        metrics: Metrics,
        *,
        headers: Mapping[str, str],
        attempts: int,
        deadline: float | None,
        log: bool,
    ) -> None:
        self.fleet, self.planning, self.upstream, self.metrics = fleet, planning, upstream, metrics
        self.headers, self.attempts, self.deadline, self.log = headers, attempts, deadline, log

    async def run(
        self, request: web.Request, incoming: Incoming, arrived: float
    ) -> web.StreamResponse:
        """Serve ``incoming``: the decode's answer, or the error the exchange finished with.
        Re-raises the cancellation of a client that left."""
        step = _Step(self, request, incoming, arrived)
        exchange: Exchange[HttpWorker] = Exchange(step.placer, attempts=self.attempts)
        step.exchange = exchange
        action = settle(self.fleet, exchange.handle(Begin()))
        try:
            async with asyncio.timeout(self.deadline) as deadline:
                while not isinstance(action, Finish):
                    event = await step.do(action)
                    action = settle(self.fleet, exchange.handle(event))
        except asyncio.CancelledError:
            if exchange.finish is None:
                step.record(settle(self.fleet, exchange.handle(ClientLeft())))
            raise
        except TimeoutError:
            if not deadline.expired() or exchange.finish is not None:
                raise
            action = settle(self.fleet, exchange.handle(DeadlinePassed()))
            assert isinstance(action, Finish)
            if step.relay is not None:
                await step.relay.end(action.error)
        return step.answer(action)


class _Step:
    """What one request's I/O keeps between the exchange's actions."""

    def __init__(
        self, driver: Driver, request: web.Request, incoming: Incoming, arrived: float
    ) -> None:
        self.driver, self.request, self.incoming, self.arrived = driver, request, incoming, arrived
        planning = driver.planning
        self.placer = HttpPlacer(
            driver.fleet,
            incoming.body,
            incoming.route,
            mrope=planning.mrope,
            request_id=incoming.request_id,
        )
        self.exchange: Exchange[HttpWorker] | None = None
        self.placement: Placement[HttpWorker] | None = None
        self.plan: LegsPlan[Member] | None = None
        self.leg: Request | None = None
        self.reply: PrefillReply | None = None
        self.relay: DecodeRelay | None = None

    async def do(self, action: Any) -> Event:
        """The I/O ``action`` asks for, and what came of it."""
        if isinstance(action, Plan):
            return await self._plan(action)
        if isinstance(action, Send):
            return await self._send(action.leg, action.member)
        assert isinstance(action, Relay)
        return await self._relay(action.member)

    async def _plan(self, action: Plan[HttpWorker]) -> Event:
        if action.after is not None:
            leg = action.leg.value if action.leg is not None else "plan"
            self.driver.metrics.retries.labels(leg).inc()
        self.placement, self.plan, self.leg, self.reply = action.placement, None, None, None
        try:
            plan = await self.driver.planning.plan(self.incoming, action.placement, self.placer)
        except PolicyError as exc:
            return PlanFailed(exc)
        self.plan = plan
        return planned(plan)

    async def _send(self, leg: Leg, member: Member) -> Event:
        plan, incoming = self.plan, self.incoming
        assert plan is not None
        name = member.role  # a render goes to the encoder or the prefill, and is named so
        started = time.monotonic()
        try:
            if leg is Leg.RENDER:
                assert plan.render is not None
                answer = await self._post(name, member.worker.url + RENDER, plan.render)
                self.plan = plan_rendered(plan, answer)
                return LegAnswered(leg)
            if leg is Leg.ENCODE:
                assert plan.encode is not None
                answer = await self._post(name, member.worker.url + GENERATE, plan.encode)
                self.plan = plan_encoded(plan, answer)
                return LegAnswered(leg)
            body: Any = plan.prefill
            raw = incoming.raw
            ours = plan.body is incoming.body and plan.prefill_route == incoming.route.value
            if raw is not None and ours:
                # The client's own body (not pinned, rendered or translated): spliced.
                spliced = prefill_bytes(raw, incoming.body, incoming.route, plan.handoff)
                body = spliced if spliced is not None else body
            url = member.worker.url + plan.prefill_route
            # Unparsed: the decode leg reads only what it needs, the ids as bytes.
            answer = await self._post("prefill", url, body, parse=False)
            self.reply = read_reply(plan, answer)
            self.leg = handed_over(plan, self.reply)
            return LegAnswered(leg, kv_facts(self.leg))
        except PolicyError as exc:
            return LegFailed(leg, exc)
        finally:
            self.driver.metrics.observe_leg(leg.value, time.monotonic() - started)

    async def _post(self, name: str, url: str, body: Any, *, parse: bool = True) -> Any:
        driver = self.driver
        request_id = self.incoming.request_id
        return await post_json(
            driver.upstream, name, url, body, request_id, driver.headers, parse=parse
        )

    async def _relay(self, member: Member) -> Event:
        plan, incoming, driver = self.plan, self.incoming, self.driver
        exchange = self.exchange
        assert plan is not None and exchange is not None
        started = time.monotonic()
        try:
            leg = decode_leg_of(plan, self.leg or handed_over(plan, None), self.reply)
            if incoming.translate is not None:
                leg = incoming.translate(leg, plan.form in STRIPPED)
            relay = self.relay = DecodeRelay(self.request, lambda: exchange.handle(FirstByte()))
            late = await relay.run(
                driver.upstream,
                member.worker.url,
                leg,
                incoming.request_id,
                stream=incoming.stream,
                headers=driver.headers,
            )
        except PolicyError as exc:
            return LegFailed(Leg.DECODE, exc)
        finally:
            driver.metrics.observe_leg(Leg.DECODE.value, time.monotonic() - started)
        driver.metrics.ttft.observe(relay.first_byte_at - self.arrived)
        driver.metrics.decode_bytes.observe(relay.sent)
        return LegAnswered(Leg.DECODE) if late is None else LegFailed(Leg.DECODE, late)

    def record(self, finish: Any) -> None:
        """Count and log the request's end."""
        assert isinstance(finish, Finish) and self.exchange is not None
        incoming, driver = self.incoming, self.driver
        form = self.plan.form.value if self.plan is not None else "-"
        driver.metrics.count_request(incoming.path, form, finish.outcome)
        if driver.log:
            attempts = self.exchange.attempt
            log_request(
                incoming.request_id, incoming.path, self.placement, form, finish.status,
                finish.outcome, attempts, self.arrived,
            )  # fmt: skip

    def answer(self, finish: Any) -> web.StreamResponse:
        """The client's answer for ``finish``, counted and logged."""
        assert isinstance(finish, Finish)
        self.record(finish)
        if finish.error is None or finish.late:
            assert self.relay is not None and self.relay.response is not None
            return self.relay.response
        return error_response(finish.error)

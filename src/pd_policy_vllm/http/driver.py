"""One request through the proxy: its [`Exchange`][pd_policy.exchange.machine.Exchange] driven with
the I/O each action asks for.

The loop is the whole of the request's life: the exchange says what to do, and a module
does it and reports what happened: [`planning`][pd_policy_vllm.http.planning] the
``Plan`` (the policy's plan on the members chosen), [`send`][pd_policy_vllm.http.send]
each ``Send`` (a render, encode or prefill leg), [`decode`][pd_policy_vllm.http.decode]
the ``Relay``. Every rule (which member, in which order, when to check the handoff,
whom to blame, whether to try again, when nothing can be retried) is the exchange's; the
fleet's bookkeeping is applied by [`settle`][pd_policy.exchange.machine.settle]. A client that
disconnects cancels the handler: the exchange is told, the legs' connections close, and
vLLM aborts what it was doing. The metrics and the request's log line are written once,
when it ends.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Callable, Mapping

from pd_policy import ClientUuids, PolicyError, Unauthorized
from pd_policy.exchange import Exchange, settle
from pd_policy.exchange.events import (
    Begin,
    ClientLeft,
    DeadlinePassed,
    Event,
    Finish,
    FirstByte,
    LegFailed,
    Plan,
    Relay,
    Send,
)
from pd_policy_vllm.http.aio import web
from pd_policy_vllm.http.attempt import Attempt
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.calls import REQUEST_ID_HEADER, leg_headers
from pd_policy_vllm.http.decode import relay
from pd_policy_vllm.http.fleet.kv_routing import KvRouting
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.fleet.metrics import Metrics
from pd_policy_vllm.http.fleet.routing import HttpPlacer
from pd_policy_vllm.http.front_door import FrontDoor, Incoming, admit, refusal
from pd_policy_vllm.http.log_format import REQUEST_ID, TRACE_ID, trace_id_of
from pd_policy_vllm.http.planning import Planning
from pd_policy_vllm.http.request_log import log_request
from pd_policy_vllm.http.send import send
from pd_policy_vllm.http.tracing import OFF, UNTRACED, Traced, Tracing
from pd_policy_vllm.http.upstream import Upstream
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["Driver"]


def _failed(event: object) -> str | None:
    return event.error.code if isinstance(event, LegFailed) else None


def _trace(traced: Traced, attempt: Attempt, finish: Finish, attempts: int) -> None:
    # What an operator filters a request's span on.
    placement, lookup = attempt.placement, attempt.lookup
    prefill = placement.prefill.name if placement is not None else None
    encoder = placement.encoder if placement is not None else None
    predicted = lookup.cached.get(prefill, 0) if lookup is not None and prefill else None
    relay = attempt.relay
    error = finish.error.code if finish.error is not None else None
    traced.set(
        {
            "pd_policy.request_id": attempt.incoming.request_id,
            "pd_policy.form": attempt.form,
            "pd_policy.prefill": prefill,
            "pd_policy.decode": placement.decode.name if placement is not None else None,
            "pd_policy.encoder": encoder.name if encoder is not None else None,
            "pd_policy.attempts": attempts,
            "pd_policy.kv_blocks_predicted": predicted,
            "pd_policy.bytes_sent": relay.sent if relay is not None and relay.sent else None,
            "pd_policy.outcome": finish.outcome,
            "http.response.status_code": finish.status,
        },
        error,
    )


class Driver:
    """The I/O of the requests of a proxy over ``fleet``: ``planning`` plans each attempt,
    ``upstream`` sends the legs with ``headers`` (the workers' key), ``attempts`` is the
    budget and ``deadline`` the seconds a whole request may take (``None``: no limit);
    ``metrics`` and, when ``log``, the request log record each end. ``kv`` looks each
    request up in the prefills' KV caches before it is placed (``None``: no KV-event
    routing). ``tracing``: each leg a span ([`tracing`][pd_policy_vllm.http.tracing]).
    [`serve`][pd_policy_vllm.http.driver.Driver.serve] admits a client's request through
    ``front_door`` (its ``client_uuids`` scoped or trusted) and runs it.
    [`run`][pd_policy_vllm.http.driver.Driver.run] answers one client."""

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
        kv: KvRouting | None = None,
        tracing: Tracing = OFF,
        front_door: FrontDoor | None = None,
        client_uuids: ClientUuids = ClientUuids.SCOPED,
    ) -> None:
        self.fleet, self.planning, self.upstream, self.metrics = fleet, planning, upstream, metrics
        self.kv, self.tracing = kv, tracing
        self.front_door = front_door if front_door is not None else FrontDoor()
        self.client_uuids = client_uuids
        self.attempts, self.deadline, self.log = attempts, deadline, log
        # Every leg's headers but its request's id (leg_headers, made once).
        self.headers = leg_headers("", headers)

    async def serve(
        self, request: web.Request, route: Route, keys: Keys, *, served_as: str | None = None
    ) -> web.StreamResponse:
        """Serve one client request on ``route`` with the proxy's ``keys`` as they are now;
        ``served_as`` is the client's route when another API is planned as ``route``."""
        # The workers see the proxy's own id, unique per request: two clients that choose
        # one id must not collide on an engine. The client's is logged and echoed back.
        request_id = uuid.uuid4().hex
        # This request's log lines (its legs' too) carry its ids; a keep-alive
        # connection's next request must not.
        ids = REQUEST_ID.set(request_id)
        trace = TRACE_ID.set(trace_id_of(request.headers.get("traceparent")))
        try:
            with self.tracing.request(request.headers, served_as or route.value) as traced:
                return await self._enter(request, route, keys, served_as, request_id, traced)
        finally:
            TRACE_ID.reset(trace)
            REQUEST_ID.reset(ids)

    async def _enter(
        self,
        request: web.Request,
        route: Route,
        keys: Keys,
        served_as: str | None,
        request_id: str,
        traced: Traced,
    ) -> web.StreamResponse:
        arrived = time.monotonic()
        client_id = request.headers.get(REQUEST_ID_HEADER)
        echo = client_id if client_id is not None else request_id
        path = served_as or route.value
        try:
            if not keys.admits(request.headers.get("Authorization")):
                raise Unauthorized()  # no byte of its body is read, no worker called
            incoming = await admit(request, route, request_id, self.front_door,
                                   self.client_uuids, keyed=bool(keys.clients),
                                   served_as=served_as, client_id=client_id)  # fmt: skip
        except PolicyError as exc:
            # Refused at the door, before any plan: logged, timed, not counted by form.
            self.metrics.observe_duration(path, time.monotonic() - arrived)
            traced.set({"http.response.status_code": exc.status}, exc.code)
            if self.log:
                log_request(request_id, path, None, None, exc.status, exc.code, 1, arrived,
                            client_id)  # fmt: skip
            return await refusal(request, exc, {REQUEST_ID_HEADER: echo})
        response = await self.run(request, incoming, arrived, traced)
        if not response.prepared:  # a stream's went out with its head (DecodeRelay)
            response.headers[REQUEST_ID_HEADER] = echo
        return response

    async def run(
        self,
        request: web.Request,
        incoming: Incoming,
        arrived: float,
        traced: Traced = UNTRACED,
    ) -> web.StreamResponse:
        """Serve ``incoming``, admitted from the client ``request`` that arrived at
        ``arrived`` (``time.monotonic``): the decode's answer, or the error the exchange
        finished with; each leg traced as a child of ``traced``, the request's span. Re-raises
        the cancellation of a client that left."""
        fleet, upstream = self.fleet, self.upstream
        headers = {**self.headers, REQUEST_ID_HEADER: incoming.request_id}
        # Tracing off, the legs go as they would (a client's trace context on them).
        spans = traced.span is not None
        if not spans and traced.passed:
            headers.update(traced.passed)
        placer = HttpPlacer(
            fleet,
            incoming.body,
            incoming.route,
            mrope=self.planning.mrope,
            request_id=incoming.request_id,
        )
        attempt = Attempt(incoming, request, arrived, placer)
        exchange: Exchange[HttpWorker] = Exchange(placer, attempts=self.attempts)
        first_byte = functools.partial(exchange.handle, FirstByte())
        try:
            async with asyncio.timeout(self.deadline) as deadline:
                if self.kv is not None:
                    # What each prefill's cache holds of the request, before it is placed.
                    tensors = self.planning.lookup_tensors(fleet)
                    attempt.lookup = await self.kv.lookup(placer, upstream, headers, tensors)
                    if attempt.lookup is not None:
                        placer.cached = attempt.lookup.cached
                action = settle(fleet, exchange.handle(Begin()))
                while not isinstance(action, Finish):
                    if isinstance(action, Plan):
                        event = await self.planning.planned(attempt, action)
                    elif spans:
                        event = await self._traced(traced, action, attempt, headers, first_byte)
                    elif isinstance(action, Send):
                        event = await send(attempt, action, upstream, headers)
                    else:
                        event = await relay(attempt, action, upstream, headers, first_byte)
                    action = settle(fleet, exchange.handle(event))
        except asyncio.CancelledError:
            if exchange.finish is None:
                ended = settle(fleet, exchange.handle(ClientLeft()))
                self._record(attempt, ended, exchange.attempt)
            raise
        except TimeoutError:
            if not deadline.expired() or exchange.finish is not None:
                raise
            action = settle(fleet, exchange.handle(DeadlinePassed()))
            assert isinstance(action, Finish)
            if attempt.relay is not None:
                await attempt.relay.end(action.error)
        assert isinstance(action, Finish)
        self._record(attempt, action, exchange.attempt)
        if spans:
            _trace(traced, attempt, action, exchange.attempt)
        if action.error is None or action.late:
            assert attempt.relay is not None and attempt.relay.response is not None
            return attempt.relay.response
        # Any leg's: a worker's words, or a worker's answer the proxy quotes, redacted.
        return upstream.redactor.error_response(action.error)

    async def _traced(
        self,
        traced: Traced,
        action: Send[HttpWorker] | Relay[HttpWorker],
        attempt: Attempt,
        headers: Mapping[str, str],
        first_byte: Callable[[], object],
    ) -> Event:
        # A leg under the request's span, the leg span's traceparent on the leg.
        leg = action.leg.value if isinstance(action, Send) else "decode"
        with self.tracing.leg(traced, leg, action.member.name, headers) as (sent, span):
            more: dict[str, object] = {}
            if isinstance(action, Send):
                event = await send(attempt, action, self.upstream, sent)
            else:
                event = await relay(attempt, action, self.upstream, sent, first_byte)
                more["pd_policy.bytes_sent"] = attempt.relay.sent if attempt.relay else None
            self.tracing.ended(span, _failed(event), more)
        return event

    def _record(self, attempt: Attempt, finish: object, attempts: int) -> None:
        assert isinstance(finish, Finish)
        incoming = attempt.incoming
        decode = attempt.relay
        answered = decode is not None and decode.first_byte_at > 0
        streamed = decode is not None and decode.first_content_at > 0
        self.metrics.record(
            incoming.path,
            attempt.form,
            finish.outcome,
            legs=attempt.legs,
            retried=attempt.retried,
            ttft=decode.first_content_at - attempt.arrived if decode and streamed else None,
            decode_bytes=decode.sent if answered and decode else None,
            duration=time.monotonic() - attempt.arrived,
        )
        if self.kv is not None:
            prefill = attempt.placement.prefill.name if attempt.placement else None
            self.metrics.kv_routed(attempt.lookup, prefill)
        if self.log:
            log_request(
                incoming.request_id,
                incoming.path,
                attempt.placement,
                attempt.form,
                finish.status,
                finish.outcome,
                attempts,
                attempt.arrived,
                incoming.client_id,
            )

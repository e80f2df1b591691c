"""Tracing a request through the proxy and into vLLM: W3C Trace Context and OpenTelemetry.

With ``--otlp-traces-endpoint`` (vLLM's own flag's name) the proxy starts a server span
for each client request, a child of the client's ``traceparent``/``tracestate`` when it
sent a valid one, and a client span for each leg (render, encode, prefill, decode),
whose own ``traceparent`` goes on the leg: a ``vllm serve`` worker started with
``--otlp-traces-endpoint`` makes its request's span a child of the leg that called it,
so one trace holds the client's, the proxy's and every worker's spans. Spans are
exported over OTLP (gRPC, or HTTP with ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``
as vLLM reads it), sampled at ``--otlp-traces-sample-ratio`` of the traces the client
did not decide (a client's sampled flag is followed).

Without the flag nothing is imported and no span is made: a client's valid
``traceparent`` (and nothing else of the client's) goes on each leg as it came, so a
traced worker's spans still join the client's trace. OpenTelemetry is the optional
``tracing`` extra; the flag without it is a one-line error at start.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

from pd_policy import InvalidConfiguration
from pd_policy.trace_context import passed_on

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

__all__ = ["OFF", "UNTRACED", "Traced", "Tracing", "check", "otlp_tracing"]


class Tracing:
    """Where the proxy's spans go: a tracer (``None``: tracing off, and a client's trace
    context passed on to each leg as it came)."""

    def __init__(self, tracer: Tracer | None = None, provider: TracerProvider | None = None):
        self.tracer, self.provider = tracer, provider

    def request(
        self, headers: Mapping[str, str], route: str
    ) -> contextlib.AbstractContextManager[Traced]:
        """The span of one client request on ``route`` (a child of the trace context in
        the client's ``headers``), current for the duration of the block; off, none,
        and the client's valid trace context to pass on."""
        carrier = passed_on(headers)
        if self.tracer is None:
            return contextlib.nullcontext(Traced(None, carrier))
        return self._spanned(carrier, route)

    @contextlib.contextmanager
    def _spanned(self, carrier: Mapping[str, str], route: str) -> Iterator[Traced]:
        assert self.tracer is not None
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        parent = TraceContextTextMapPropagator().extract(carrier)
        with self.tracer.start_as_current_span(
            f"POST {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": "POST", "http.route": route},
        ) as span:
            yield Traced(span, {})

    @contextlib.contextmanager
    def leg(
        self, request: Traced, leg: str, worker: str, headers: Mapping[str, str]
    ) -> Iterator[tuple[Mapping[str, str], Span | None]]:
        """A leg's span (``leg`` to the member named ``worker``) as a child of the
        request's, and the leg's ``headers`` with its trace context."""
        if self.tracer is None or request.span is None:
            yield ({**headers, **request.passed} if request.passed else headers), None
            return
        from opentelemetry.propagate import inject
        from opentelemetry.trace import SpanKind

        attributes = {"pd_policy.leg": leg, "server.address": worker}
        with self.tracer.start_as_current_span(
            leg, kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            carrier: dict[str, str] = {}
            inject(carrier)  # the leg span's context, W3C Trace Context
            yield {**headers, **carrier}, span

    @staticmethod
    def ended(span: Span | None, error: str | None, attributes: Mapping[str, Any]) -> None:
        """A leg's end on its ``span``: its ``attributes``, and ``error`` (a code) when it
        failed."""
        if span is None:
            return
        span.set_attributes({k: v for k, v in attributes.items() if v is not None})
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", error)
            span.set_status(Status(StatusCode.ERROR, error))

    def shutdown(self) -> None:
        """Export what is left; the provider's spans stop."""
        if self.provider is not None:
            self.provider.shutdown()


class Traced:
    """A request's span (``None``: off), and the client's trace context to pass on."""

    __slots__ = ("passed", "span")

    def __init__(self, span: Span | None, passed: Mapping[str, str]) -> None:
        self.span, self.passed = span, passed

    def set(self, attributes: Mapping[str, Any], error: str | None = None) -> None:
        """Attributes an operator filters on (``None`` values left out), and the error
        code the request failed with."""
        Tracing.ended(self.span, error, attributes)


#: Tracing off.
OFF: Final = Tracing()
#: A request traced by nobody.
UNTRACED: Final = Traced(None, {})


def check(endpoint: str | None) -> None:
    """Raise [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] when
    ``endpoint`` is given and OpenTelemetry (the ``tracing`` extra) is not installed."""
    if endpoint is None:
        return
    try:
        import opentelemetry.exporter.otlp.proto.grpc.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise InvalidConfiguration(
            "--otlp-traces-endpoint needs OpenTelemetry: install pd-policy's tracing extra",
            param="otlp_traces_endpoint",
        ) from None


def otlp_tracing(
    endpoint: str | None, ratio: float = 1.0, service: str = "pd-policy-proxy"
) -> Tracing:
    """Spans exported to the OTLP collector at ``endpoint`` (``None``: off), a ``ratio``
    of the traces the proxy starts sampled. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] when OpenTelemetry is
    not installed (the ``tracing`` extra)."""
    if endpoint is None:
        return OFF
    check(endpoint)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": service}),
        sampler=ParentBased(TraceIdRatioBased(ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(_exporter(endpoint)))
    return Tracing(provider.get_tracer("pd_policy_vllm.http"), provider)


def _exporter(endpoint: str) -> Any:
    # As vLLM: gRPC unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL says http/protobuf.
    import os

    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc") == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=endpoint)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcExporter,
    )

    return GrpcExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))

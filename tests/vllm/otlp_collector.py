"""An OTLP trace collector for the tests: OpenTelemetry's own gRPC ``TraceService`` on a
loopback port the OS picks, keeping every span it is sent with the ``service.name`` of
the process that sent it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import attrs
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

import grpc

__all__ = ["Collected", "Collector", "collector"]


@attrs.frozen
class Collected:
    """One span as exported: who sent it, its name, ids (hex) and parent's (``""``: a
    root), and its attributes."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """The spans exported to it so far (``spans``), and its ``endpoint``."""

    def __init__(self) -> None:
        self.spans: list[Collected] = []
        self.endpoint = ""
        self._lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (the proto's name)
        for resource in request.resource_spans:
            attributes = {a.key: _value(a.value) for a in resource.resource.attributes}
            service = str(attributes.get("service.name", ""))
            for scope in resource.scope_spans:
                for span in scope.spans:
                    collected = Collected(
                        service, span.name, span.trace_id.hex(), span.span_id.hex(),
                        span.parent_span_id.hex(),
                        {a.key: _value(a.value) for a in span.attributes},
                    )  # fmt: skip
                    with self._lock:
                        self.spans.append(collected)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait(self, check: Any, timeout: float = 60.0) -> list[Collected]:
        """The spans once ``check(spans)`` holds; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if check(spans):
                return spans
            assert time.monotonic() < deadline, f"spans never arrived: {spans}"
            time.sleep(0.2)


@contextmanager
def collector() -> Iterator[Collector]:
    """A collector served on 127.0.0.1 for the duration of the block."""
    found = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(found, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    found.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield found
    finally:
        server.stop(grace=None)

"""The Ray decode server's legs carry the client's trace context, checked: Ray's own
``RawRequestInfo`` with a valid ``traceparent`` kept (stripped, with its ``tracestate``),
an invalid one dropped, every other header as Ray sent it."""

from __future__ import annotations

from ray.llm._internal.serve.core.protocol import RawRequestInfo

from pd_policy_ray.tracing import traced_info

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_valid_trace_context_goes_on_and_the_rest_as_ray_sent_it() -> None:
    info = RawRequestInfo(headers={"traceparent": f" {PARENT}", "tracestate": "a=1",
                                   "x-session-id": "s"})  # fmt: skip
    leg = traced_info(info)
    assert leg.headers == {"traceparent": PARENT, "tracestate": "a=1", "x-session-id": "s"}
    assert info.headers["traceparent"] == f" {PARENT}"  # the client's own is not changed


def test_an_invalid_traceparent_reaches_no_engine_nor_its_tracestate() -> None:
    info = RawRequestInfo(headers={"Traceparent": "00-bad", "tracestate": "a=1", "x-a": "b"})
    assert traced_info(info).headers == {"x-a": "b"}
    assert traced_info(None) is None

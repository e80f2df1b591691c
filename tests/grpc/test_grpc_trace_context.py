"""The caller's trace context on every leg of the gRPC routers: a valid W3C
``traceparent`` (and its ``tracestate``) goes on each leg's call as gRPC metadata, so a
traced worker's span joins the caller's trace; nothing else of the caller's goes, and
an invalid one goes nowhere. Over engines on loopback that record what they receive."""

from __future__ import annotations

from typing import Any

import pytest
from test_grpc_fleet import image, run

from pd_policy_grpc.fleet import FleetPd
from pd_policy_grpc.wire import pb

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "vendor=abc"


async def _served(fleet: FleetPd, request: pb.GenerateRequest, **kw: Any) -> list[Any]:
    return [r async for r in fleet.generate(request, **kw)]


def _traced(engines: list[Any]) -> list[dict[str, str]]:
    return [{k: v for k, v in m.items() if k in ("traceparent", "tracestate", "x-other")}
            for e in engines for m in e.metadata]  # fmt: skip


@pytest.mark.parametrize("bytes_router", [False, True])
def test_both_legs_carry_a_valid_trace_context_and_nothing_else(bytes_router: bool) -> None:
    async def test(fleet: FleetPd, ps: list[Any], ds: list[Any], now: list[float]) -> None:
        caller = {"traceparent": f" {PARENT} ", "tracestate": STATE, "x-other": "secret"}
        request: Any = image(1, "r1")
        if bytes_router:
            request = request.SerializeToString()
        assert await _served(fleet, request, trace_context=caller)
        expected = {"traceparent": PARENT, "tracestate": STATE}
        assert _traced(ps) == [expected] and _traced(ds) == [expected]

    run(test, prefills=1, decodes=1, bytes_router=bytes_router)


@pytest.mark.parametrize(
    "caller",
    [
        {},
        {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01", "tracestate": STATE},
        {"traceparent": "garbage", "tracestate": STATE},
        {"tracestate": STATE},
    ],
)
def test_no_valid_traceparent_sends_no_trace_context(caller: dict[str, str]) -> None:
    async def test(fleet: FleetPd, ps: list[Any], ds: list[Any], now: list[float]) -> None:
        assert await _served(fleet, image(2, "r2"), trace_context=caller)
        assert _traced(ps) == [{}] and _traced(ds) == [{}]

    run(test, prefills=1, decodes=1)


def test_a_tracestate_that_is_not_printable_ascii_is_left_out() -> None:
    async def test(fleet: FleetPd, ps: list[Any], ds: list[Any], now: list[float]) -> None:
        caller = {"traceparent": PARENT, "tracestate": "a=\x01b"}
        assert await _served(fleet, image(3, "r3"), trace_context=caller)
        assert _traced(ps) == [{"traceparent": PARENT}] == _traced(ds)

    run(test, prefills=1, decodes=1)

"""W3C trace context as every router passes a caller's on: only a valid ``traceparent``,
stripped, and a bounded printable ``tracestate`` beside it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pd_policy.trace_context import MAX_TRACESTATE, passed_on, trace_id_of

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def test_a_valid_traceparent_goes_on_stripped_with_its_tracestate() -> None:
    headers = {"traceparent": f"  {PARENT}\t", "tracestate": "a=1,b=2", "cookie": "x"}
    assert passed_on(headers) == {"traceparent": PARENT, "tracestate": "a=1,b=2"}
    assert trace_id_of(PARENT) == TRACE


def test_a_tracestate_too_long_or_unprintable_is_dropped_and_alone_is_nothing() -> None:
    assert passed_on({"traceparent": PARENT, "tracestate": "a" * (MAX_TRACESTATE + 1)}) == {
        "traceparent": PARENT
    }
    assert passed_on({"traceparent": PARENT, "tracestate": "a=\n"}) == {"traceparent": PARENT}
    assert passed_on({"traceparent": PARENT, "tracestate": "a=é"}) == {"traceparent": PARENT}
    assert passed_on({"tracestate": "a=1"}) == {}


@given(st.text(max_size=80))
def test_whatever_a_caller_sends_only_a_valid_traceparent_goes_on(parent: str) -> None:
    carried = passed_on({"traceparent": parent})
    assert carried == ({"traceparent": parent.strip()} if trace_id_of(parent) else {})
    if carried:
        assert trace_id_of(carried["traceparent"]) is not None

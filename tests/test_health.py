"""A worker's health as a state machine: ejection after failures, backoff, re-admission, drain."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    Health,
    HealthPolicy,
    HealthState,
    MalformedRequest,
    drain,
    eject,
    leg_failed,
    leg_succeeded,
    probe_failed,
    readmit,
    routable,
)

POLICY = HealthPolicy(failures=3, backoff=1.0, max_backoff=8.0)
HEALTHY = HealthState(Health.HEALTHY)


def test_a_new_worker_is_routed_to_only_once_a_probe_passes() -> None:
    state = HealthState()
    assert not routable(state) and state.probe_due(0.0)
    assert not routable(probe_failed(state, POLICY, 0.0))  # still starting
    assert routable(readmit(state, 0.0))


def test_failures_in_a_row_eject_and_a_success_between_them_forgives() -> None:
    state = HEALTHY
    for _ in range(2):
        state = leg_failed(state, POLICY, 0.0)
    assert routable(state)
    assert routable(leg_failed(leg_succeeded(state), POLICY, 0.0))  # the run is broken
    ejected = leg_failed(state, POLICY, 10.0)
    assert ejected.health is Health.EJECTED and ejected.until == 11.0


def test_the_wait_doubles_for_each_ejection_in_a_row_up_to_the_maximum() -> None:
    state, waits = HEALTHY, []
    for now in (0.0, 100.0, 200.0, 300.0, 400.0, 500.0):
        state = probe_failed(state, POLICY, now)
        waits.append(state.until - now)
        assert readmit(state, now + waits[-1] - 0.01).health is not Health.HEALTHY
        state = readmit(state, now + waits[-1])
        assert routable(state)
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    # A leg that succeeds after re-admission resets the backoff.
    assert probe_failed(leg_succeeded(state), POLICY, 0.0).until == 1.0


def test_a_draining_worker_never_comes_back_by_itself() -> None:
    state = drain(HEALTHY)
    for step in range(5):
        state = [
            leg_succeeded(state), readmit(state, 1e9), leg_failed(state, POLICY, 0.0),
            eject(state, POLICY, 0.0), probe_failed(state, POLICY, 0.0),
        ][step]  # fmt: skip
        assert state.health is Health.DRAINING and not routable(state)


def test_an_answer_from_before_an_ejection_readmits_nothing() -> None:
    ejected = eject(HEALTHY, POLICY, 0.0)
    assert leg_succeeded(ejected) == ejected


EVENTS = st.sampled_from(["fail", "ok", "probe_fail", "probe_ok", "drain", "wait"])


@given(st.lists(EVENTS, max_size=40))
def test_any_sequence_keeps_the_invariants(events: list[str]) -> None:
    state, now = HealthState(), 0.0
    drained = False
    for name in events:
        before = state
        if name == "fail":
            state = leg_failed(state, POLICY, now)
        elif name == "ok":
            state = leg_succeeded(state)
        elif name == "probe_fail":
            state = probe_failed(state, POLICY, now)
        elif name == "probe_ok":
            state = readmit(state, now)
        elif name == "drain":
            state, drained = drain(state), True
        else:
            now += 3.0
        assert routable(state) is (state.health is Health.HEALTHY)
        assert not (drained and routable(state))
        if state.health is Health.EJECTED:
            assert state.until > now - 3.0 - 1e-9 or before.health is Health.EJECTED
            assert state.until - now <= POLICY.max_backoff
        # Only a probe makes an unroutable worker routable again.
        if routable(state) and not routable(before):
            assert name == "probe_ok"


@pytest.mark.parametrize(
    "kwargs", [{"failures": 0}, {"backoff": 0}, {"max_backoff": -1.0}, {"failures": True}]
)
def test_an_ill_typed_policy_is_a_typed_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(MalformedRequest):
        HealthPolicy(**kwargs)

"""A request's life through a router: the stages in order, and retries only where invisible."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    LifecycleError,
    MalformedRequest,
    MropeOnLanguageModelOnlyDecode,
    NoWorkerAvailable,
    PolicyError,
    RequestLife,
    Stage,
    WorkerFailedToStart,
    WorkerStreamError,
    begin,
    done,
    fail,
    responding,
)

LEGS = [Stage.RENDERING, Stage.ENCODING, Stage.PREFILLING, Stage.DECODING]


def test_a_request_runs_its_legs_in_order_and_skips_what_it_does_not_need() -> None:
    life = begin(RequestLife(), Stage.PREFILLING)
    life = begin(life, Stage.DECODING)
    life = done(responding(life))
    assert life.finished and life.stage is Stage.DONE
    for bad in (Stage.PREFILLING, Stage.RENDERING):
        with pytest.raises(LifecycleError):
            begin(begin(RequestLife(), Stage.DECODING), bad)  # no going back
    with pytest.raises(LifecycleError):
        responding(begin(RequestLife(), Stage.PREFILLING))  # only a decode answers
    with pytest.raises(LifecycleError):
        begin(RequestLife(), Stage.DONE)
    with pytest.raises(LifecycleError):
        fail(life, WorkerStreamError("decode", "INTERNAL"))


def test_a_worker_failure_before_the_first_byte_is_retried_elsewhere_once() -> None:
    error = WorkerFailedToStart("decode", detail="refused", http_status=503)
    life = fail(begin(begin(RequestLife(), Stage.PREFILLING), Stage.DECODING), error, "d1")
    assert life.stage is Stage.PLANNING and life.attempt == 2 and life.failed_on == ("d1",)
    again = fail(begin(life, Stage.PREFILLING), error, "p2")
    assert again.stage is Stage.FAILED and again.failed_on == ("d1", "p2")  # attempts spent


def test_never_after_the_client_has_seen_output_nor_for_a_refusal() -> None:
    started = responding(begin(RequestLife(attempts=5), Stage.DECODING))
    assert fail(started, WorkerStreamError("decode", "UNAVAILABLE")).stage is Stage.FAILED
    refusal = MropeOnLanguageModelOnlyDecode()
    assert fail(begin(RequestLife(attempts=5), Stage.PREFILLING), refusal).stage is Stage.FAILED
    # The 400 a worker gives is not retried either: the same request fails the same way.
    bad = WorkerFailedToStart("prefill", detail="bad", http_status=400)
    assert fail(RequestLife(attempts=5), bad).stage is Stage.FAILED


ERRORS: list[PolicyError] = [
    WorkerFailedToStart("prefill", detail="x", http_status=503),
    WorkerFailedToStart("decode", detail="x", http_status=400),
    WorkerStreamError("decode", "INTERNAL"),
    NoWorkerAvailable("prefill"),
    MropeOnLanguageModelOnlyDecode(),
]
EVENTS = st.one_of(
    st.sampled_from(LEGS).map(lambda leg: ("begin", leg)),
    st.just(("responding", None)),
    st.sampled_from(range(len(ERRORS))).map(lambda i: ("fail", i)),
)


@given(st.integers(1, 4), st.lists(EVENTS, max_size=30))
def test_no_sequence_retries_what_a_client_saw_or_runs_past_its_attempts(
    attempts: int, events: list[tuple[str, object]]
) -> None:
    life = RequestLife(attempts=attempts)
    for name, arg in events:
        if life.finished:
            break
        before = life
        try:
            if name == "begin":
                assert isinstance(arg, Stage)
                life = begin(life, arg)
            elif name == "responding":
                life = responding(life)
            else:
                assert isinstance(arg, int)
                error = ERRORS[arg]
                life = fail(life, error, f"w{arg}")
                retried = life.stage is Stage.PLANNING
                assert retried is (
                    error.retryable and before.stage is not Stage.RESPONDING
                    and before.attempt < attempts
                )  # fmt: skip
        except LifecycleError:
            life = before  # a router's mistake changes nothing
        assert 1 <= life.attempt <= attempts
        assert len(life.failed_on) <= life.attempt


def test_attempts_must_be_positive() -> None:
    with pytest.raises(MalformedRequest):
        RequestLife(attempts=0)

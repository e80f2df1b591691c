"""The one prober's rules: who is probed, what a failed check does, when a member is described
anew, and that a member comes back as what it is now. The adapters' probes over real
sockets are in ``tests/http/test_http_fleet.py`` and ``tests/grpc/test_grpc_fleet.py``."""

from __future__ import annotations

import pytest

from pd_policy import Health, HealthPolicy, Prober, ProbeTimes, Roster


def setup() -> tuple[Roster[str], Prober[str], list[float]]:
    now = [0.0]
    roster: Roster[str] = Roster(clock=lambda: now[0], policy=HealthPolicy(backoff=10.0))
    roster.add_member("prefill", "p", "prefill as described")
    roster.add_member("decode", "d", "vision decode")
    return roster, Prober(roster, ProbeTimes(redescribe=30.0)), now


def test_a_failed_check_ejects_and_an_ejected_member_waits_its_time_out() -> None:
    roster, prober, now = setup()
    d = roster.named("d")
    assert d is not None and prober.round() == list(roster)
    assert prober.checked(d, healthy=False) is False
    assert d.health.health is Health.EJECTED and d not in prober.round()
    now[0] = 10.0  # its backoff has run out: probed again
    assert d in prober.round()


def test_a_member_coming_back_is_described_anew_and_readmitted_as_what_it_is_now() -> None:
    roster, prober, now = setup()
    d = roster.named("d")
    assert d is not None
    prober.checked(d, healthy=False)
    now[0] = 10.0
    assert prober.checked(d, healthy=True) is True  # not in service: describe it first
    prober.described(d, "language-model-only decode")
    assert d.health.health is Health.HEALTHY and d.worker == "language-model-only decode"


def test_a_member_in_service_is_described_anew_only_once_its_description_is_old() -> None:
    roster, prober, now = setup()
    p = roster.named("p")
    assert p is not None
    assert prober.checked(p, healthy=True) is True  # never described by this prober
    generation = roster.generation
    prober.described(p, "prefill restarted")
    assert roster.generation == generation + 1 and p.worker == "prefill restarted"
    now[0] = 29.0
    assert prober.checked(p, healthy=True) is False
    now[0] = 30.0
    assert prober.checked(p, healthy=True) is True


def test_a_description_that_cannot_be_read_is_a_failed_check() -> None:
    roster, prober, _ = setup()
    p = roster.named("p")
    assert p is not None
    prober.described(p, None)
    assert p.health.health is Health.EJECTED and p.worker == "prefill as described"


def test_a_draining_member_is_not_probed_and_leaves_once_idle() -> None:
    roster, prober, _ = setup()
    d = roster.named("d")
    assert d is not None
    roster.drain(d)
    d.outstanding = 1
    assert d not in prober.round() and roster.named("d") is d
    d.outstanding = 0
    prober.round()
    assert roster.named("d") is None


def test_one_join_rule_a_described_worker_serves_at_once_an_undescribed_one_starts() -> None:
    roster, prober, _ = setup()
    assert all(m.health.health is Health.HEALTHY for m in roster)
    starting = roster.add_member("encode", "e", "not described yet", healthy=False)
    assert starting.health.health is Health.STARTING and starting in prober.round()


def test_probe_times_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        ProbeTimes(interval=0)

"""The prefill's lease on its KV (``pd_policy.kv_lease``): the rule at its bounds, where a
router learns the lease, and what a handoff planned under it carries. The exchange's use of
it is in ``test_exchange.py`` and ``test_exchange_properties.py``."""

from __future__ import annotations

import math

import pytest

from pd_policy import ERROR_CATALOG, InvalidConfiguration, KvConnectorMode, PrefillKv
from pd_policy.connectors import plan_kv_handoff
from pd_policy.kv_lease import (
    NIXL_LEASE,
    SAFETY_MARGIN,
    KvLeaseExpired,
    check_kv_lease,
    lease_margin,
    prefill_lease,
)


def test_a_handoff_is_relayed_while_more_than_the_margin_of_its_lease_is_left() -> None:
    check_kv_lease(30.0, 0.0)
    check_kv_lease(30.0, 24.999)
    for age in (25.0, 25.001, 31.0, 1e9, math.inf, math.nan):
        with pytest.raises(KvLeaseExpired):
            check_kv_lease(30.0, age)


def test_a_short_lease_keeps_half_of_itself_as_the_margin() -> None:
    assert lease_margin(NIXL_LEASE) == SAFETY_MARGIN == 5.0
    assert lease_margin(6.0) == 3.0
    check_kv_lease(6.0, 2.999)
    with pytest.raises(KvLeaseExpired):
        check_kv_lease(6.0, 3.0)


def test_no_lease_binds_nothing() -> None:
    check_kv_lease(None, 1e9)
    check_kv_lease(None, math.inf)


def test_the_error_is_catalogued_a_retryable_502() -> None:
    error = KvLeaseExpired()
    assert error.status == 502 and error.retryable and error.code == "pd_kv_lease_expired"
    entry = ERROR_CATALOG["pd_kv_lease_expired"]
    assert entry.status == 502 and entry.retryable and entry.error is KvLeaseExpired


@pytest.mark.parametrize("lease", [0, -1.0, math.inf, math.nan, True, "30"])
def test_a_prefill_lease_is_a_positive_number_of_seconds(lease: object) -> None:
    with pytest.raises(InvalidConfiguration):
        PrefillKv(KvConnectorMode.NIXL, lease=lease)  # type: ignore[arg-type]


def test_a_handoff_planned_through_a_leased_prefill_carries_its_lease() -> None:
    for mode in (KvConnectorMode.NIXL, KvConnectorMode.NIXL_PUSH):
        assert plan_kv_handoff(PrefillKv(mode, lease=12), n=1).lease == 12
        assert plan_kv_handoff(PrefillKv(mode), n=1).lease is None
        assert plan_kv_handoff(PrefillKv(mode, lease=12), n=2).lease is None  # no prefill


def test_a_prefills_lease_is_read_from_its_nixl_connectors_config() -> None:
    extra = {"kv_connector_extra_config": {"kv_lease_duration": 12}}
    nixl = {"kv_connector": "NixlConnector", **extra}
    assert prefill_lease(nixl, KvConnectorMode.NIXL) == 12
    push = {"kv_connector": "NixlPushConnector", **extra}
    assert prefill_lease(push, KvConnectorMode.NIXL_PUSH) == 12
    # Unset, or a prefill that does not describe itself (stated nixl): vLLM's default.
    assert prefill_lease({"kv_connector": "NixlConnector"}, KvConnectorMode.NIXL) == NIXL_LEASE
    assert prefill_lease({}, KvConnectorMode.NIXL) == NIXL_LEASE
    # Within a MultiConnector, the NIXL connector's own, not a store's beside it.
    store = {"kv_connector": "LMCacheConnectorV1",
             "kv_connector_extra_config": {"kv_lease_duration": 99}}  # fmt: skip
    multi = {"kv_connector": "MultiConnector",
             "kv_connector_extra_config": {"connectors": [store, nixl]}}  # fmt: skip
    assert prefill_lease(multi, KvConnectorMode.NIXL) == 12
    # Contracts without a lease.
    for mode in (KvConnectorMode.TRANSFER, KvConnectorMode.MOONCAKE, KvConnectorMode.PASSTHROUGH):
        assert prefill_lease(nixl, mode) is None

"""The KV handoff by connector: the table of every connector (served or refused), a worker's
whole config, a decode's KV load, the route rule, the plan, the prefill leg, the mint."""

from __future__ import annotations

import json
import uuid

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    CONNECTOR_MODES,
    MROPE_GRID_KEYS,
    NIXL_PREFILL_PARAMS,
    REQUIRED_KV_FIELDS,
    InvalidConfiguration,
    KvConnectorMode,
    LegacyKvParams,
    MalformedRequest,
    PrefillKv,
    Request,
    Support,
    WorkerCapability,
    apply_kv_handoff,
    connector_mode,
    mint_transfer_id,
    plan_kv_handoff,
    prefill_leg,
)
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy.tools.scenarios import mrope_request, text_request
from pd_policy.wire_errors import LegRoutesDiffer
from pd_policy.wires import CONNECTORS, check_leg_routes, decode_kv_from_config, handoff_mode
from strategies import requests

ROUTES = ["/v1/chat/completions", "/v1/completions", "/inference/v1/generate", "/v1/responses"]

prefill_kvs = st.builds(
    PrefillKv,
    st.sampled_from(list(KvConnectorMode)),
    engine_id=st.none() | st.sampled_from(["", "p0"]),
    bootstrap_host=st.just("h"),
    dp_size=st.integers(1, 3),
)


def test_the_connector_table_matches_names_exactly() -> None:
    assert connector_mode("NixlConnector") is KvConnectorMode.NIXL
    assert connector_mode("TransferConnector") is KvConnectorMode.TRANSFER
    assert connector_mode("MooncakeConnector") is KvConnectorMode.MOONCAKE
    assert connector_mode("MooncakeStoreConnector") is KvConnectorMode.PASSTHROUGH
    assert connector_mode("") is KvConnectorMode.PASSTHROUGH
    for guess in ("nixl", "NIXLConnector", "NixlConnectorX", "MultiConnector", "P2pNcclConnector"):
        with pytest.raises(InvalidConfiguration) as caught:
            connector_mode(guess)
        assert caught.value.status == 500 and caught.value.param == "kv_connector"
    assert set(CONNECTOR_MODES.values()) == set(KvConnectorMode)


@pytest.mark.parametrize(
    ("kv", "engine_id"),
    [
        (PrefillKv(KvConnectorMode.MOONCAKE, "e", "h"), "e"),
        (PrefillKv(KvConnectorMode.MOONCAKE, "e", "h", dp_size=2, dp_rank=1), "e_dp1"),
        (PrefillKv(KvConnectorMode.MOONCAKE, "e", "h", dp_size=2), None),
        (PrefillKv(KvConnectorMode.MOONCAKE, "", "h"), None),
        (PrefillKv(KvConnectorMode.MOONCAKE, None, "h", dp_size=2, dp_rank=0), None),
    ],
)
def test_the_mooncake_engine_id_follows_data_parallelism(
    kv: PrefillKv, engine_id: str | None
) -> None:
    assert kv.mooncake_engine_id == engine_id
    handoff = plan_kv_handoff(kv, n=1, transfer_id="xfer-t")
    if engine_id is None:
        assert handoff.decode_legacy == LegacyKvParams("h", 8998)
        assert handoff.decode_params is None and handoff.prefill_params is None
    else:
        assert json.loads(handoff.decode_params or "")["remote_engine_id"] == engine_id
        assert handoff.decode_legacy is None


def test_the_plan_for_each_contract() -> None:
    nixl = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
    assert (nixl.runs_prefill, nixl.prefill_params, nixl.relays) == (
        True,
        NIXL_PREFILL_PARAMS,
        True,
    )
    passthrough = plan_kv_handoff(PrefillKv(KvConnectorMode.PASSTHROUGH), n=1)
    assert (passthrough.prefill_params, passthrough.relays) == (None, True)
    minted = plan_kv_handoff(
        PrefillKv(KvConnectorMode.MOONCAKE, "e", "h", 9), n=1, transfer_id="xfer-t"
    )
    assert json.loads(minted.prefill_params or "") == {
        "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "xfer-t",
    }  # fmt: skip
    assert json.loads(minted.decode_params or "") == {
        "do_remote_decode": False, "do_remote_prefill": True, "transfer_id": "xfer-t",
        "remote_engine_id": "e", "remote_bootstrap_addr": "http://h:9",
    }  # fmt: skip
    assert not minted.relays  # the transfer is named up front; nothing comes back to relay


@given(prefill_kvs, st.integers(2, 5))
def test_n_samples_never_run_a_prefill_leg(kv: PrefillKv, n: int) -> None:
    handoff = plan_kv_handoff(kv, n=n)
    assert not handoff.runs_prefill
    assert handoff.prefill_params is handoff.decode_params is None
    assert not handoff.relays
    # Legacy Mooncake names its host and port on every decode leg, n>1 included.
    legacy = kv.mode is KvConnectorMode.MOONCAKE and kv.mooncake_engine_id is None
    assert (handoff.decode_legacy is not None) == legacy
    with pytest.raises(ValueError, match="no prefill"):
        prefill_leg(text_request(n=n), handoff)


@given(requests(), prefill_kvs)
def test_the_prefill_leg_keeps_everything_but_n_the_tag_and_cpu_grids(
    request: Request, kv: PrefillKv
) -> None:
    handoff = plan_kv_handoff(kv, n=1, transfer_id="xfer-t")
    leg = prefill_leg(request, handoff)
    assert leg.n == 1
    expected_kv = handoff.prefill_params or request.kv_transfer_params
    assert leg.kv_transfer_params == expected_kv
    assert (leg.input_ids, leg.text, leg.media_refs, leg.cache_salt, leg.kv_legacy) == (
        request.input_ids, request.text, request.media_refs, request.cache_salt,
        request.kv_legacy,
    )  # fmt: skip
    assert len(leg.batches) == len(request.batches)
    for before, after in zip(request.batches, leg.batches, strict=True):
        grids = set(before.tensor_names) & MROPE_GRID_KEYS
        assert grids <= set(after.keep_on_cpu_keys)
        assert after.keep_on_cpu_keys[: len(before.keep_on_cpu_keys)] == before.keep_on_cpu_keys
        assert attrs.evolve(after, keep_on_cpu_keys=before.keep_on_cpu_keys) == before


def test_a_prefill_leg_lists_a_grid_the_router_left_out() -> None:
    request = mrope_request()
    bare = request.derive(batches=(attrs.evolve(request.batches[0], keep_on_cpu_keys=()),))
    leg = prefill_leg(bare, plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1))
    assert leg.batches[0].keep_on_cpu_keys == ("image_grid_thw",)
    assert leg.batches[0].pixel_values == bare.batches[0].pixel_values


def test_apply_puts_the_minted_transfer_or_the_legacy_pair_on_the_decode_leg() -> None:
    leg = text_request().derive(kv_transfer_params={"client": 1})
    minted = plan_kv_handoff(PrefillKv(KvConnectorMode.MOONCAKE, "e", "h"), n=1, transfer_id="x")
    assert apply_kv_handoff(leg, minted).kv_transfer_params == minted.decode_params
    legacy = plan_kv_handoff(PrefillKv(KvConnectorMode.MOONCAKE, None, "h"), n=2)
    assert apply_kv_handoff(leg, legacy).kv_legacy == LegacyKvParams("h", 8998)
    nixl = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
    assert apply_kv_handoff(leg, nixl) is leg


def test_prefill_kv_refuses_what_cannot_work() -> None:
    for bad in (
        {"mode": KvConnectorMode.MOONCAKE, "engine_id": "e"},
        {"mode": KvConnectorMode.NIXL, "bootstrap_port": 0},
        {"mode": KvConnectorMode.NIXL, "dp_size": 0},
        {"mode": KvConnectorMode.NIXL, "dp_size": 2, "dp_rank": 2},
        {"mode": KvConnectorMode.NIXL, "dp_rank": True},
    ):
        with pytest.raises(InvalidConfiguration):
            PrefillKv(**bad)  # type: ignore[arg-type]
    assert PrefillKv(KvConnectorMode.MOONCAKE, "e", "fd00::1").bootstrap_addr == (
        "http://[fd00::1]:8998"
    )


def test_a_minted_transfer_id_is_a_uuid7() -> None:
    fixed = mint_transfer_id(unix_ms=0x0190_1234_5678, random=bytes(range(10)))
    assert fixed == mint_transfer_id(unix_ms=0x0190_1234_5678, random=bytes(range(10)))
    for tid in (fixed, mint_transfer_id()):
        assert tid.startswith("xfer-")
        value = uuid.UUID(tid.removeprefix("xfer-"))
        assert value.version == 7 and value.variant == uuid.RFC_4122
    assert uuid.UUID(fixed[5:]).int >> 80 == 0x0190_1234_5678
    later = mint_transfer_id(unix_ms=0x0190_1234_5679, random=bytes(10))
    assert later > fixed  # time-ordered
    assert mint_transfer_id() != mint_transfer_id()


# --- every connector, served or refused (pd_policy.wires) ----------------------------------


def test_every_row_is_served_with_a_contract_or_refused_with_a_reason() -> None:
    for name, wire in CONNECTORS.items():
        if wire.mode is not None:
            assert connector_mode(name) is wire.mode and not wire.why
            continue
        assert wire.why, name
        with pytest.raises(InvalidConfiguration) as caught:
            connector_mode(name)
        assert caught.value.param == "kv_connector" and not caught.value.retryable
        assert wire.why in caught.value.message  # the reason, named
    assert {n: w.mode for n, w in CONNECTORS.items() if w.mode is not None} == CONNECTOR_MODES
    assert connector_mode("NixlPushConnector") is KvConnectorMode.NIXL_PUSH


def _multi(*names: str) -> dict[str, object]:
    children = [{"kv_connector": n} for n in names]
    return {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": children}}


TIERS = {"secondary_tiers": [{"type": "fs"}, {"type": "p2p"}]}
P2P = {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": TIERS}
MULTI_P2P = {
    "kv_connector": "MultiConnector",
    "kv_connector_extra_config": {"connectors": [{"kv_connector": "NixlConnector"}, P2P]},
}


@pytest.mark.parametrize(
    ("config", "mode"),
    [
        ({}, KvConnectorMode.PASSTHROUGH),
        ({"kv_connector": "NixlPushConnector"}, KvConnectorMode.NIXL_PUSH),
        ({"kv_connector": "OffloadingConnector",
          "kv_connector_extra_config": {"secondary_tiers": [{"type": "fs"}]}},
         KvConnectorMode.PASSTHROUGH),
        (_multi("NixlConnector", "LMCacheConnectorV1"), KvConnectorMode.NIXL),
        (_multi("SimpleCPUOffloadConnector", "MooncakeConnector"), KvConnectorMode.MOONCAKE),
        (_multi("LMCacheConnectorV1", "OffloadingConnector"), KvConnectorMode.PASSTHROUGH),
        (_multi("NixlPushConnector", "HiSparseConnector"), KvConnectorMode.NIXL_PUSH),
    ],
)  # fmt: skip
def test_the_mode_of_a_whole_config(config: dict[str, object], mode: KvConnectorMode) -> None:
    assert handoff_mode(config) is mode


@pytest.mark.parametrize(
    ("config", "why"),
    [
        (P2P, "p2p"),
        (_multi("NixlConnector", "MooncakeConnector"), "two handoffs"),
        (_multi("SimpleCPUOffloadConnector"), "none of its connectors"),
        (_multi("NixlConnector", "HF3FSKVConnector"), "token ids alone"),
        (_multi("NixlConnector", "DecodeBenchConnector"), "dummy"),
        (_multi("NixlConnector", "MultiConnector"), "inside a MultiConnector"),
        (_multi("NixlConnector", "OffloadingConnector"), None),  # no p2p tier: served
        (MULTI_P2P, "p2p"),
        ({"kv_connector": "MultiConnector"}, "list of connector configs"),
        ({"kv_connector": 7}, "must be a string"),
        ({"kv_connector": "SimpleCPUOffloadConnector"}, "not a P/D handoff"),
        ({"kv_connector": "MyConnector"}, "unknown KV connector"),
    ],
)
def test_a_config_the_proxy_cannot_serve_is_refused_naming_why(
    config: dict[str, object], why: str | None
) -> None:
    if why is None:
        handoff_mode(config)
        return
    with pytest.raises(InvalidConfiguration, match=why) as caught:
        handoff_mode(config)
    assert caught.value.param == "kv_connector" and caught.value.status == 500


def test_the_operators_mode_wins_but_push_stays_push() -> None:
    push = {"kv_connector": "NixlPushConnector"}
    assert handoff_mode(push, stated=KvConnectorMode.NIXL) is KvConnectorMode.NIXL_PUSH
    assert handoff_mode(_multi("NixlPushConnector", "LMCacheConnectorV1"),
                        stated=KvConnectorMode.NIXL) is KvConnectorMode.NIXL_PUSH  # fmt: skip
    stated = KvConnectorMode.PASSTHROUGH
    assert handoff_mode(push, stated=stated) is stated
    for refused in (P2P, {"kv_connector": "MyConnector"}, {"kv_connector": "HiSparseConnector"}):
        assert handoff_mode(refused, stated=KvConnectorMode.NIXL) is KvConnectorMode.NIXL


@pytest.mark.parametrize(
    ("config", "loads", "on_failure"),
    [
        (None, KvLoad.NONE, LoadFailure.FAIL),
        ({}, KvLoad.NONE, LoadFailure.FAIL),
        ({"kv_connector": "NixlConnector"}, KvLoad.BY_REQUEST, LoadFailure.FAIL),
        ({"kv_connector": "NixlConnector", "kv_load_failure_policy": "recompute"},
         KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE),
        ({"kv_connector": "NixlConnector", "kv_load_failure_policy": "retry"},
         KvLoad.BY_REQUEST, LoadFailure.UNKNOWN),
        (P2P, KvLoad.BY_CONTENT, LoadFailure.FAIL),
        ({"kv_connector": "SimpleCPUOffloadConnector"}, KvLoad.NONE, LoadFailure.FAIL),
        (_multi("LMCacheConnectorV1", "NixlConnector"), KvLoad.BY_REQUEST, LoadFailure.FAIL),
        (_multi("LMCacheConnectorV1", "OffloadingConnector"), KvLoad.BY_CONTENT, LoadFailure.FAIL),
        (_multi("HiSparseConnector"), KvLoad.NONE, LoadFailure.FAIL),
        (_multi("MyConnector", "LMCacheConnectorV1"), KvLoad.UNKNOWN, LoadFailure.FAIL),
        ({"kv_connector": "MultiConnector"}, KvLoad.UNKNOWN, LoadFailure.FAIL),
        ({"kv_connector": "MyConnector"}, KvLoad.UNKNOWN, LoadFailure.FAIL),
        ({"kv_connector": 7}, KvLoad.UNKNOWN, LoadFailure.FAIL),
    ],
)  # fmt: skip
def test_how_a_decode_takes_kv_from_its_config(
    config: dict[str, object] | None, loads: KvLoad, on_failure: LoadFailure
) -> None:
    # A decode is described, never refused: what it cannot do only narrows what it gets.
    kv = decode_kv_from_config(config)
    assert (kv.loads, kv.on_failure) == (loads, on_failure)
    assert kv.blind_to_stripped_media is (
        loads in (KvLoad.BY_CONTENT, KvLoad.NONE) or on_failure is LoadFailure.RECOMPUTE
    )


@given(st.sampled_from(list(KvConnectorMode)), st.sampled_from(ROUTES), st.sampled_from(ROUTES))
def test_only_push_refuses_legs_on_two_routes(
    mode: KvConnectorMode, prefill: str, decode: str
) -> None:
    if mode.legs_share_route and prefill != decode:
        with pytest.raises(LegRoutesDiffer) as caught:
            check_leg_routes(mode, prefill, decode)
        assert (caught.value.status, caught.value.retryable) == (400, False)
        assert prefill in caught.value.message and decode in caught.value.message
    else:
        check_leg_routes(mode, prefill, decode)
    assert mode.legs_share_route is (mode is KvConnectorMode.NIXL_PUSH)


def test_push_is_planned_and_checked_as_nixl() -> None:
    push = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL_PUSH), n=1)
    nixl = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
    assert attrs.evolve(push, mode=KvConnectorMode.NIXL) == nixl
    assert REQUIRED_KV_FIELDS[KvConnectorMode.NIXL_PUSH] == REQUIRED_KV_FIELDS[KvConnectorMode.NIXL]


def test_decode_kv_labels_round_trip_and_only_exact_values_count() -> None:
    for kv in (DecodeKv(), DecodeKv(KvLoad.BY_CONTENT), DecodeKv(KvLoad.NONE, LoadFailure.FAIL),
               DecodeKv(KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE)):  # fmt: skip
        worker = WorkerCapability(Support.FALSE, decode_kv=kv)
        assert WorkerCapability.from_labels(worker.to_labels()) == worker
    odd = {"supports_vision": "false", "kv_load": "Content", "kv_load_failure_policy": "yes"}
    assert WorkerCapability.from_labels(odd).decode_kv == DecodeKv()
    with pytest.raises(MalformedRequest):
        WorkerCapability(decode_kv="content")  # type: ignore[arg-type]

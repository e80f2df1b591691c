"""The prefill-leg sanitiser, the handoff plan on the wire, and the KV relay."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proto_strategies import protos, to_proto

import pd_policy
from pd_policy import (
    NIXL_PREFILL_PARAMS,
    DecodeForm,
    InvalidConfiguration,
    KvConnectorMode,
    MissingKvTransferParams,
    PrefillKv,
    plan_kv_handoff,
)
from pd_policy.tools.scenarios import image_request, mrope_request, text_request
from pd_policy_grpc import (
    apply_kv_handoff,
    ensure_kv_handoff,
    kv_mode_from_server_info,
    prefill_kv_from_info,
    prefill_leg,
    relay_kv,
    request_view,
)
from pd_policy_grpc.wire import pb

NIXL = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
MOONCAKE = PrefillKv(KvConnectorMode.MOONCAKE, engine_id="p0", bootstrap_host="10.0.0.1")


def routed(n: int = 1) -> pb.GenerateRequest:
    msg = to_proto(image_request(n=n))
    msg.sampling_params.stop_token_ids.extend([2, 3])
    msg.sampling_params.min_tokens = 4
    return msg


def test_the_prefill_leg_is_sanitised_and_tagged() -> None:
    original = routed()
    before = original.SerializeToString()
    leg = prefill_leg(original, NIXL)
    assert original.SerializeToString() == before
    params = leg.sampling_params
    assert (params.max_tokens, params.min_tokens, params.n, params.ignore_eos) == (1, 0, 1, True)
    assert list(params.stop) == [] and list(params.stop_token_ids) == []
    assert params.temperature == original.sampling_params.temperature
    assert leg.stream is False
    assert json.loads(leg.kv_transfer_params_json) == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
    }
    assert leg.kv_transfer_params_json == NIXL_PREFILL_PARAMS
    assert leg.mm_inputs == original.mm_inputs  # the prefill keeps the pixels


def test_a_prefill_leg_keeps_its_grids_on_cpu() -> None:
    # The defect the real servicer showed: without the key, the second request with the
    # same image killed the prefill engine (KeyError: 'image_grid_thw').
    original = to_proto(mrope_request())
    original.mm_inputs.ClearField("keep_on_cpu_keys")
    original.mm_inputs.keep_on_cpu_keys.append("pixel_values")
    leg = prefill_leg(original, NIXL)
    assert list(leg.mm_inputs.keep_on_cpu_keys) == ["pixel_values", "image_grid_thw"]
    assert leg.mm_inputs.pixel_values == original.mm_inputs.pixel_values
    assert list(original.mm_inputs.keep_on_cpu_keys) == ["pixel_values"]


@given(protos(), st.sampled_from(list(KvConnectorMode)))
def test_the_wire_prefill_leg_is_the_core_prefill_leg(
    proto: pb.GenerateRequest, mode: KvConnectorMode
) -> None:
    kv = PrefillKv(mode, engine_id="p0", bootstrap_host="h")
    handoff = plan_kv_handoff(kv, n=1, transfer_id="xfer-1")
    before = proto.SerializeToString(deterministic=True)
    leg = prefill_leg(proto, handoff)
    assert proto.SerializeToString(deterministic=True) == before
    expected = pd_policy.prefill_leg(request_view(proto), handoff)
    assert request_view(leg) == expected
    for batch in expected.batches:
        assert {t.name for t in batch.tensors} & pd_policy.MROPE_GRID_KEYS <= set(
            batch.keep_on_cpu_keys
        )


def test_passthrough_is_not_tagged_and_n_samples_run_no_prefill() -> None:
    passthrough = plan_kv_handoff(PrefillKv(KvConnectorMode.PASSTHROUGH), n=1)
    leg = prefill_leg(to_proto(text_request()), passthrough)
    assert not leg.HasField("kv_transfer_params_json")
    n2 = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=2)
    assert not n2.runs_prefill
    with pytest.raises(ValueError, match="no prefill"):
        prefill_leg(routed(n=2), n2)


def test_in_place_sanitises_the_routers_own_message() -> None:
    original = routed()
    assert prefill_leg(original, NIXL, in_place=True) is original
    assert original.sampling_params.max_tokens == 1


def test_mooncake_mints_one_transfer_for_both_legs() -> None:
    handoff = plan_kv_handoff(MOONCAKE, n=1, transfer_id="xfer-abc")
    prefill = prefill_leg(routed(), handoff)
    assert json.loads(prefill.kv_transfer_params_json) == {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "transfer_id": "xfer-abc",
    }
    decode = apply_kv_handoff(to_proto(image_request()), handoff)
    assert json.loads(decode.kv_transfer_params_json) == {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": "xfer-abc",
        "remote_engine_id": "p0",
        "remote_bootstrap_addr": "http://10.0.0.1:8998",
    }
    # The minted transfer is the handoff: the 502 check accepts it.
    ensure_kv_handoff(to_proto(image_request()), DecodeForm.TEXT_PLUS_HASHES, decode, handoff.mode)


def test_mooncake_under_data_parallelism_pins_the_rank() -> None:
    pinned = PrefillKv(
        KvConnectorMode.MOONCAKE, engine_id="p0", bootstrap_host="h", dp_size=4, dp_rank=2
    )
    handoff = plan_kv_handoff(pinned, n=1, transfer_id="xfer-1")
    decode = apply_kv_handoff(to_proto(text_request()), handoff)
    assert json.loads(decode.kv_transfer_params_json)["remote_engine_id"] == "p0_dp2"
    assert prefill_leg(routed(), handoff).data_parallel_rank == 2


@pytest.mark.parametrize("n", [1, 2])
def test_legacy_mooncake_puts_host_and_port_on_every_decode_leg(n: int) -> None:
    unpinned = PrefillKv(KvConnectorMode.MOONCAKE, engine_id="p0", bootstrap_host="h", dp_size=2)
    handoff = plan_kv_handoff(unpinned, n=n)
    assert handoff.decode_params is None and handoff.prefill_params is None
    leg = apply_kv_handoff(to_proto(text_request(n=n)), handoff)
    assert (leg.kv_transfer_params.remote_host, leg.kv_transfer_params.remote_port) == (
        "h",
        8998,
    )
    assert not leg.HasField("kv_transfer_params_json")


def test_the_prefill_worker_is_read_from_its_server_info() -> None:
    info = pb.GetServerInfoResponse(
        kv_connector="MooncakeConnector", kv_engine_id="eng", data_parallel_size=1
    )
    kv = prefill_kv_from_info(info, "prefill-0.svc:50051", bootstrap_port=9000)
    assert kv == PrefillKv(KvConnectorMode.MOONCAKE, "eng", "prefill-0.svc", 9000)
    assert prefill_kv_from_info(info, "[fd00::1]:50051").bootstrap_addr == "http://[fd00::1]:8998"
    assert prefill_kv_from_info(info, "dns:///p:1").bootstrap_host == "p"
    for name, mode in [
        ("NixlConnector", KvConnectorMode.NIXL),
        ("TransferConnector", KvConnectorMode.TRANSFER),
        ("ExampleConnector", KvConnectorMode.PASSTHROUGH),
        ("", KvConnectorMode.PASSTHROUGH),
    ]:
        assert kv_mode_from_server_info(pb.GetServerInfoResponse(kv_connector=name)) is mode


def test_an_unknown_connector_is_refused_at_start_up() -> None:
    info = pb.GetServerInfoResponse(kv_connector="MyConnector")
    with pytest.raises(InvalidConfiguration) as caught:
        prefill_kv_from_info(info, "p:1")
    assert caught.value.param == "kv_connector"
    assert "explicitly" in caught.value.message
    explicit = prefill_kv_from_info(info, "p:1", mode=KvConnectorMode.NIXL)
    assert explicit.mode is KvConnectorMode.NIXL


def test_relay_takes_the_json_and_the_legacy_pair() -> None:
    complete = pb.GenerateComplete(kv_transfer_params_json='{"transfer_id":"x"}')
    complete.kv_transfer_params.remote_host = "p"
    complete.kv_transfer_params.remote_port = 9
    leg = relay_kv(to_proto(text_request()), complete)
    assert leg.kv_transfer_params_json == '{"transfer_id":"x"}'
    assert (leg.kv_transfer_params.remote_host, leg.kv_transfer_params.remote_port) == ("p", 9)


def test_nothing_is_relayed_for_n_samples_or_an_empty_text() -> None:
    complete = pb.GenerateComplete(kv_transfer_params_json='{"transfer_id":"x"}')
    assert not relay_kv(to_proto(text_request(n=2)), complete).HasField("kv_transfer_params_json")
    empty = pb.GenerateComplete(kv_transfer_params_json="")
    leg = relay_kv(to_proto(image_request()), empty)
    with pytest.raises(MissingKvTransferParams):
        ensure_kv_handoff(
            to_proto(image_request()), DecodeForm.TEXT_PLUS_HASHES, leg, KvConnectorMode.NIXL
        )


def test_the_handoff_check_spares_text_and_vision_forms() -> None:
    bare = to_proto(image_request())
    ensure_kv_handoff(
        to_proto(text_request()), DecodeForm.TEXT_PLUS_HASHES, to_proto(text_request()), NIXL.mode
    )
    ensure_kv_handoff(bare, DecodeForm.IDENTITY_ONLY, bare, NIXL.mode)
    with pytest.raises(MissingKvTransferParams):
        ensure_kv_handoff(bare, DecodeForm.TEXT_PLUS_HASHES, bare, NIXL.mode)

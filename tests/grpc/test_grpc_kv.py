"""The prefill-leg sanitiser and the KV relay on the wire."""

from __future__ import annotations

import json

import pytest
from proto_strategies import to_proto

from pd_policy import DecodeForm, MissingKvTransferParams
from pd_policy.scenarios import image_request, text_request
from pd_policy_grpc import (
    NIXL_PREFILL_PARAMS,
    KvConnectorMode,
    ensure_kv_handoff,
    prefill_leg,
    relay_kv,
)
from pd_policy_grpc.wire import pb


def routed(n: int = 1) -> pb.GenerateRequest:
    msg = to_proto(image_request(n=n))
    msg.sampling_params.stop_token_ids.extend([2, 3])
    msg.sampling_params.min_tokens = 4
    return msg


def test_the_prefill_leg_is_sanitised_and_tagged() -> None:
    original = routed()
    before = original.SerializeToString()
    leg = prefill_leg(original)
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


def test_passthrough_and_n_samples_are_not_tagged() -> None:
    assert not prefill_leg(to_proto(text_request()), KvConnectorMode.PASSTHROUGH).HasField(
        "kv_transfer_params_json"
    )
    assert not prefill_leg(routed(n=2)).HasField("kv_transfer_params_json")


def test_in_place_sanitises_the_routers_own_message() -> None:
    original = routed()
    assert prefill_leg(original, in_place=True) is original
    assert original.sampling_params.max_tokens == 1


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
        ensure_kv_handoff(to_proto(image_request()), DecodeForm.TEXT_PLUS_HASHES, leg)


def test_the_handoff_check_spares_text_and_vision_forms() -> None:
    bare = to_proto(image_request())
    ensure_kv_handoff(
        to_proto(text_request()), DecodeForm.TEXT_PLUS_HASHES, to_proto(text_request())
    )
    ensure_kv_handoff(bare, DecodeForm.IDENTITY_ONLY, bare)
    with pytest.raises(MissingKvTransferParams):
        ensure_kv_handoff(bare, DecodeForm.TEXT_PLUS_HASHES, bare)

"""Nothing the gRPC adapter does to build the legs changes the router's own message."""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st
from proto_strategies import protos

import pd_policy_grpc
from fuzzing import counted, fuzz
from pd_policy import (
    KvConnectorMode,
    PolicyError,
    PrefillKv,
    VisionSupport,
    WorkerCapability,
    plan_kv_handoff,
)
from pd_policy_grpc.wire import pb
from strategies import workers

#: A prefill's completion with both KV forms: the relay writes onto the decode leg only.
COMPLETE = pb.GenerateComplete(kv_transfer_params_json='{"remote_engine_id": "p0"}')
COMPLETE.kv_transfer_params.remote_host = "10.0.0.1"


@fuzz
@given(protos(), workers, st.sampled_from(list(KvConnectorMode)))
@counted
def test_no_leg_builder_changes_the_routers_message(
    proto: pb.GenerateRequest, worker: WorkerCapability, mode: KvConnectorMode
) -> None:
    before = proto.SerializeToString(deterministic=True)
    handoff = plan_kv_handoff(
        PrefillKv(mode, engine_id="p0", bootstrap_host="10.0.0.1"), n=1, transfer_id="xfer-1"
    )
    legs = [
        pd_policy_grpc.prefill_leg(proto, handoff),
        pd_policy_grpc.clone_without_mm(proto),
        pd_policy_grpc.identity_only(proto),
    ]
    metadata = WorkerCapability(VisionSupport.FALSE, accepts_mm_metadata=VisionSupport.TRUE)
    for capability in (worker, metadata):
        try:
            form, leg = pd_policy_grpc.build_decode_leg(proto, capability)
        except PolicyError:
            continue
        leg = pd_policy_grpc.apply_kv_handoff(leg, handoff)
        legs.append(pd_policy_grpc.relay_kv(leg, COMPLETE))
        with contextlib.suppress(PolicyError):
            pd_policy_grpc.ensure_kv_handoff(proto, form, leg, handoff.mode)
    assert proto.SerializeToString(deterministic=True) == before
    assert all(leg is not proto for leg in legs)

"""Which value wins where a gRPC leg replaces a field the client may have set too.

The byte path replaces a field by dropping every occurrence the client wrote and adding
its own; the message path assigns. Both must end with the policy's value, whatever the
client sent, and however often (a scalar written twice: the last wins on parse, so a
leg that kept one of the client's occurrences after its own would lose). One test per
replaced field, on both paths.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import pd_policy_grpc
from pd_policy import (
    KvConnectorMode,
    KvHandoff,
    PrefillKv,
    VisionSupport,
    WorkerCapability,
    plan_kv_handoff,
)
from pd_policy_grpc import raw
from pd_policy_grpc.raw.protowire import VARINT, tag, varint
from pd_policy_grpc.wire import pb

MOONCAKE = PrefillKv(KvConnectorMode.MOONCAKE, engine_id="p0", bootstrap_host="10.0.0.1",
                     dp_size=2, dp_rank=1)  # fmt: skip
LM_ONLY = WorkerCapability(VisionSupport.FALSE)
_RANK = pb.GenerateRequest.DESCRIPTOR.fields_by_name["data_parallel_rank"].number


def _client(**fields: object) -> pb.GenerateRequest:
    msg = pb.GenerateRequest(request_id="r", tokenized=pb.TokenizedInput(input_ids=[1, 2, 3]))
    msg.sampling_params.max_tokens = 64
    msg.sampling_params.n = 1
    for name, value in fields.items():
        setattr(msg, name, value)
    return msg


def _twice(msg: pb.GenerateRequest, rank: int) -> bytes:
    # The client's rank written twice (-1 last): a leg must drop both occurrences.
    return msg.SerializeToString() + tag(_RANK, VARINT) + varint(rank)


Path = Callable[[bytes, KvHandoff], pb.GenerateRequest]


def _raw_prefill(data: bytes, handoff: KvHandoff) -> pb.GenerateRequest:
    return pb.GenerateRequest.FromString(bytes(raw.prefill_leg(raw.read_request(data), handoff)))


def _message_prefill(data: bytes, handoff: KvHandoff) -> pb.GenerateRequest:
    return pd_policy_grpc.prefill_leg(pb.GenerateRequest.FromString(data), handoff)


PATHS = pytest.mark.parametrize("leg", [_raw_prefill, _message_prefill], ids=["bytes", "message"])


@PATHS
def test_the_handoffs_rank_and_parameters_win_over_the_clients(leg: Path) -> None:
    handoff = plan_kv_handoff(MOONCAKE, n=1, transfer_id="xfer-1")
    client = _client(data_parallel_rank=0, kv_transfer_params_json='{"transfer_id": "mine"}')
    out = leg(_twice(client, -1), handoff)
    assert out.data_parallel_rank == 1
    assert out.kv_transfer_params_json == handoff.prefill_params


@PATHS
def test_the_prefill_caps_its_output_and_does_not_stream(leg: Path) -> None:
    handoff = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
    out = leg(_client(stream=True).SerializeToString(), handoff)
    assert out.sampling_params.max_tokens == 1 and not out.stream
    assert out.data_parallel_rank == 0  # NIXL names no rank: the client's stays


@pytest.mark.parametrize("path", ["bytes", "message"])
def test_the_relayed_parameters_win_over_the_clients_and_the_handoffs(path: str) -> None:
    handoff = plan_kv_handoff(MOONCAKE, n=1, transfer_id="xfer-2")
    data = _client(kv_transfer_params_json='{"transfer_id": "mine"}').SerializeToString()
    complete = pb.GenerateComplete(kv_transfer_params_json='{"transfer_id": "relayed"}')
    if path == "bytes":
        _, raw_leg = raw.build_decode_leg(raw.read_request(data), LM_ONLY)
        leg = raw.relay_kv(raw.apply_kv_handoff(raw_leg, handoff), complete)
        out = pb.GenerateRequest.FromString(bytes(leg))
    else:
        _, message_leg = pd_policy_grpc.build_decode_leg(pb.GenerateRequest.FromString(data),
                                                         LM_ONLY)  # fmt: skip
        out = pd_policy_grpc.relay_kv(pd_policy_grpc.apply_kv_handoff(message_leg, handoff),
                                      complete)  # fmt: skip
    assert out.kv_transfer_params_json == '{"transfer_id": "relayed"}'

"""A worker's capability from its info responses and labels."""

from __future__ import annotations

from pd_policy import KvConnectorMode, VisionSupport, WorkerCapability
from pd_policy_grpc import (
    capability_from_info,
    capability_from_labels,
    kv_mode_from_server_info,
    worker_labels,
)
from pd_policy_grpc.wire import pb


def test_from_info() -> None:
    model = pb.GetModelInfoResponse(supports_vision=False)
    server = pb.GetServerInfoResponse(mm_processor="inprocess", mm_media_ref_schemes="https, data")
    assert capability_from_info(model) == WorkerCapability(VisionSupport.FALSE)
    assert capability_from_info(pb.GetModelInfoResponse(supports_vision=True), server) == (
        WorkerCapability(VisionSupport.TRUE, "inprocess", ("https", "data"))
    )
    # A servicer that predates the honest probe: its false means nothing.
    legacy = capability_from_info(model, reports_supports_vision=False)
    assert legacy.supports_vision is VisionSupport.UNKNOWN
    assert not legacy.language_model_only


def test_labels_round_trip_through_the_gateway_flattening() -> None:
    model = pb.GetModelInfoResponse(supports_vision=False)
    server = pb.GetServerInfoResponse(mm_processor="", mm_media_ref_schemes="")
    labels = worker_labels(model, server)
    assert labels["supports_vision"] == "false"
    assert capability_from_labels(labels) == capability_from_info(model, server)
    assert capability_from_labels({}).supports_vision is VisionSupport.UNKNOWN


def test_kv_mode_is_read_from_the_prefill_worker() -> None:
    assert (
        kv_mode_from_server_info(pb.GetServerInfoResponse(kv_connector="NixlConnector"))
        is KvConnectorMode.NIXL
    )
    assert kv_mode_from_server_info(
        pb.GetServerInfoResponse(kv_connector="LMCacheConnectorV1")
    ) is (KvConnectorMode.PASSTHROUGH)

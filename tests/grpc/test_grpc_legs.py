"""The proto leg builders have exactly the core's semantics, and leave their input alone."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, reject
from hypothesis import strategies as st
from proto_strategies import protos, to_proto

import pd_policy
import pd_policy_grpc
from pd_policy import DecodeForm, MalformedRequest, PolicyError, VisionSupport, WorkerCapability
from pd_policy_grpc import request_view
from pd_policy_grpc.wire import pb
from strategies import metadata_requests, workers

Builder = Callable[[pb.GenerateRequest], pb.GenerateRequest]


def serialized(msg: pb.GenerateRequest) -> bytes:
    return msg.SerializeToString(deterministic=True)


@pytest.mark.parametrize(
    ("wire", "core"),
    [
        (pd_policy_grpc.clone_without_mm, pd_policy.clone_without_mm),
        (pd_policy_grpc.identity_only, pd_policy.identity_only),
    ],
)
@given(proto=protos())
def test_viewing_the_proto_leg_equals_the_core_leg_of_the_view(
    wire: Builder, core: Callable[[pd_policy.Request], pd_policy.Request], proto: pb.GenerateRequest
) -> None:
    before = serialized(proto)
    leg = wire(proto)
    assert serialized(proto) == before
    assert request_view(leg) == core(request_view(proto))
    # Fields the policy does not model ride along untouched.
    assert leg.sampling_params == proto.sampling_params
    assert leg.tokenized.original_text == proto.tokenized.original_text
    assert (leg.stream, leg.data_parallel_rank) == (proto.stream, proto.data_parallel_rank)


@given(protos())
def test_has_mrope_grids_agrees(proto: pb.GenerateRequest) -> None:
    assert pd_policy_grpc.has_mrope_grids(proto) == pd_policy.has_mrope_grids(request_view(proto))


@given(protos(), workers)
def test_build_decode_leg_agrees_with_the_core(
    proto: pb.GenerateRequest, worker: WorkerCapability
) -> None:
    before = serialized(proto)
    view = request_view(proto)
    try:
        expected = pd_policy.build_decode_leg(view, worker)
    except PolicyError as exc:
        with pytest.raises(type(exc)):
            pd_policy_grpc.build_decode_leg(proto, worker)
        assert serialized(proto) == before
        return
    form, leg = pd_policy_grpc.build_decode_leg(proto, worker)
    assert serialized(proto) == before
    assert (form, request_view(leg)) == expected
    if form is DecodeForm.FULL:
        assert leg == proto
        assert leg is not proto


@pytest.mark.parametrize("support", list(VisionSupport))
def test_a_batch_of_placeholders_alone_is_media_without_identity(support: VisionSupport) -> None:
    # Placeholders say the prompt holds media: with no hashes, the decode could serve one
    # item's cache for another's. The generated messages draw this corner rarely.
    proto = pb.GenerateRequest(request_id="r")
    proto.tokenized.input_ids.extend([1, 2, 3, 4])
    place = proto.mm_inputs.mm_placeholders.add()
    place.offset, place.length = 1, 2
    core = pd_policy.build_decode_leg
    with pytest.raises(pd_policy.MissingMediaIdentity):
        core(request_view(proto), WorkerCapability(support))
    with pytest.raises(pd_policy.MissingMediaIdentity):
        pd_policy_grpc.build_decode_leg(proto, WorkerCapability(support))


@given(protos(mm=True), st.sampled_from(list(VisionSupport)))
def test_a_stripped_or_identity_leg_keeps_no_pixels(
    proto: pb.GenerateRequest, support: VisionSupport
) -> None:
    try:
        form, leg = pd_policy_grpc.build_decode_leg(proto, WorkerCapability(support))
    except PolicyError:
        return
    if form is DecodeForm.FULL:
        return
    for batch in [leg.mm_inputs, *leg.extra_mm_inputs]:
        assert not batch.HasField("pixel_values")
        for tensor in batch.model_specific_tensors.values():
            assert tensor.WhichOneof("payload") == "inline"


def test_view_reads_wire_normalisations() -> None:
    proto = pb.GenerateRequest(request_id="r", text="hi")
    assert request_view(proto).n == 1  # an unset n means one sample
    proto.mm_inputs.mm_hashes.append("h")  # MODALITY_UNSPECIFIED means image
    assert request_view(proto).batches[0].modality is pd_policy.Modality.IMAGE
    with pytest.raises(MalformedRequest):
        request_view(pb.GenerateRequest(request_id="no-input"))


@given(metadata_requests(), st.sampled_from(list(VisionSupport)))
def test_the_metadata_leg_on_the_wire_is_the_cores(
    request: pd_policy.Request, metadata: VisionSupport
) -> None:
    try:
        proto = to_proto(request)
    except UnicodeEncodeError:
        reject()  # the core takes lone surrogates; proto strings must be UTF-8
    worker = WorkerCapability(VisionSupport.FALSE, accepts_mm_metadata=metadata)
    before = serialized(proto)
    try:
        expected = pd_policy.build_decode_leg(request_view(proto), worker)
    except PolicyError as exc:
        assert metadata is not VisionSupport.TRUE  # a complete request is served
        with pytest.raises(type(exc)):
            pd_policy_grpc.build_decode_leg(proto, worker)
        return
    form, leg = pd_policy_grpc.build_decode_leg(proto, worker)
    assert form is DecodeForm.MROPE_METADATA
    assert serialized(proto) == before
    assert (form, request_view(leg)) == expected
    assert request_view(pd_policy_grpc.metadata_only(proto)) == expected[1]
    assert not leg.HasField("media_refs")
    for batch in [leg.mm_inputs, *leg.extra_mm_inputs]:
        assert not batch.HasField("pixel_values")

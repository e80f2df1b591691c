"""Random, truncated and inconsistent messages each give a clear typed error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proto_strategies import protos, to_proto

import pd_policy_grpc
from fuzzing import counted, fuzz
from pd_policy import (
    KvConnectorMode,
    MalformedRequest,
    PolicyError,
    VisionSupport,
    WorkerCapability,
)
from pd_policy.tools.scenarios import image_request
from pd_policy_grpc import parse_generate_request, request_view
from pd_policy_grpc.wire import common, pb


@fuzz
@given(st.binary(max_size=256))
@counted
def test_random_bytes_parse_or_give_a_typed_400(data: bytes) -> None:
    try:
        request = parse_generate_request(data)
    except MalformedRequest as exc:
        assert exc.status == 400
    else:
        request_view(request)  # a message that parses and checks has a view


@fuzz
@given(protos(), st.data())
@counted
def test_truncated_messages_give_a_typed_400_or_a_consistent_message(
    proto: pb.GenerateRequest, data: st.DataObject
) -> None:
    wire = proto.SerializeToString()
    cut = data.draw(st.integers(0, max(len(wire) - 1, 0)))
    try:
        request = parse_generate_request(wire[:cut])
    except MalformedRequest:
        return
    for support in VisionSupport:
        try:
            pd_policy_grpc.build_decode_leg(request, WorkerCapability(support))
        except PolicyError as exc:
            assert exc.status == 400


#: Byte edits of a valid message: a flip, an insertion, a deletion, at a drawn place.
EDITS = ("flip", "insert", "delete")


@fuzz
@given(protos(), st.lists(st.tuples(st.sampled_from(EDITS), st.integers(0), st.integers(0, 255)),
                          min_size=1, max_size=4))  # fmt: skip
@counted
def test_edited_messages_give_a_typed_400_or_a_leg_for_every_worker(
    proto: pb.GenerateRequest, edits: list[tuple[str, int, int]]
) -> None:
    wire = bytearray(proto.SerializeToString())
    for edit, where, byte in edits:
        at = where % (len(wire) + 1)
        if edit == "insert":
            wire.insert(at, byte)
        elif wire and edit == "flip":
            wire[at % len(wire)] ^= byte or 1
        elif wire:
            del wire[at % len(wire)]
    try:
        request = parse_generate_request(bytes(wire))
    except MalformedRequest as exc:
        assert exc.status == 400
        return
    request_view(request)
    for support in VisionSupport:
        try:
            form, leg = pd_policy_grpc.build_decode_leg(request, WorkerCapability(support))
        except PolicyError as exc:
            assert exc.status == 400
            continue
        try:
            pd_policy_grpc.ensure_kv_handoff(request, form, leg, KvConnectorMode.NIXL)
        except PolicyError as exc:
            assert exc.status == 502


def image() -> pb.GenerateRequest:
    return to_proto(image_request())


def corrupt_placeholder(msg: pb.GenerateRequest) -> None:
    msg.mm_inputs.mm_placeholders[0].length = 10_000


def corrupt_hash(msg: pb.GenerateRequest) -> None:
    msg.mm_inputs.mm_hashes[0] = ""


def refs_with_batches(msg: pb.GenerateRequest) -> None:
    msg.media_refs.items.add(modality=common.IMAGE, url="https://x/y.png")


def no_input(msg: pb.GenerateRequest) -> None:
    msg.ClearField("tokenized")


def bad_kv(msg: pb.GenerateRequest) -> None:
    msg.kv_transfer_params_json = "[1, 2]"


def unknown_modality(msg: pb.GenerateRequest) -> None:
    msg.mm_inputs.modality = 42


def placeholder_on_text(msg: pb.GenerateRequest) -> None:
    msg.text = "hello"


@pytest.mark.parametrize(
    ("corrupt", "param"),
    [
        (corrupt_placeholder, "mm_inputs.mm_placeholders[0]"),
        (corrupt_hash, "mm_inputs.mm_hashes[0]"),
        (refs_with_batches, "media_refs"),
        (no_input, "input"),
        (bad_kv, "kv_transfer_params_json"),
        (unknown_modality, "mm_inputs.modality"),
        (placeholder_on_text, "mm_inputs.mm_placeholders[0]"),
    ],
)
def test_inconsistent_fields_are_named(corrupt: object, param: str) -> None:
    msg = image()
    corrupt(msg)  # type: ignore[operator]
    for call in (
        request_view,
        lambda m: pd_policy_grpc.build_decode_leg(m, WorkerCapability(VisionSupport.FALSE)),
        lambda m: parse_generate_request(m.SerializeToString()),
    ):
        with pytest.raises(MalformedRequest) as exc:
            call(msg)
        assert exc.value.param == param
        assert exc.value.status == 400
        assert "https://x" not in exc.value.message


def test_a_legacy_port_beyond_65535_is_refused_by_the_check_as_by_the_view() -> None:
    # Found by make fuzz: the wire's port is a uint32, and the check let one through that
    # the view then refused.
    msg = image()
    msg.kv_transfer_params.remote_host = "10.0.0.1"
    msg.kv_transfer_params.remote_port = 65536
    with pytest.raises(MalformedRequest) as caught:
        parse_generate_request(msg.SerializeToString())
    assert caught.value.param == "kv_transfer_params.remote_port"
    msg.kv_transfer_params.remote_port = 65535
    request_view(parse_generate_request(msg.SerializeToString()))


def test_a_tensor_without_a_name_is_refused_by_the_check_as_by_the_view() -> None:
    # Found by make fuzz: a map entry with an empty key passed the check, and the view's
    # descriptor refused it.
    msg = image()
    msg.mm_inputs.model_specific_tensors[""].dtype = "int64"
    with pytest.raises(MalformedRequest) as caught:
        parse_generate_request(msg.SerializeToString())
    assert caught.value.param == "mm_inputs.model_specific_tensors"

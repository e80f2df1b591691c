"""The byte-level reader and legs have exactly the message code's semantics, on any valid
serialization (fields in any order, split, repeated, packed or not, unknown fields), and
refuse what the runtime refuses."""

from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proto_strategies import protos, to_proto
from scrambler import UNKNOWN_NUMBERS, scramble

import pd_policy_grpc
from fuzzing import counted, fuzz
from pd_policy import (
    KvConnectorMode,
    MalformedRequest,
    PolicyError,
    PrefillKv,
    VisionSupport,
    WorkerCapability,
    plan_kv_handoff,
)
from pd_policy.tools.scenarios import image_request
from pd_policy_grpc import raw
from pd_policy_grpc.raw.protowire import fields
from pd_policy_grpc.wire import pb
from strategies import workers

METADATA = WorkerCapability(VisionSupport.FALSE, accepts_mm_metadata=VisionSupport.TRUE)
MODES = [
    PrefillKv(KvConnectorMode.NIXL),
    PrefillKv(KvConnectorMode.PASSTHROUGH),
    PrefillKv(KvConnectorMode.MOONCAKE, engine_id="p0", bootstrap_host="10.0.0.1", dp_size=2,
              dp_rank=1),
    PrefillKv(KvConnectorMode.MOONCAKE, bootstrap_host="10.0.0.2"),  # legacy: no engine id
]  # fmt: skip


def scrambled(msg: pb.GenerateRequest, seed: int) -> bytes:
    return scramble(pb.GenerateRequest.DESCRIPTOR, msg.SerializeToString(), random.Random(seed))


def known(data: bytes | pb.GenerateRequest) -> pb.GenerateRequest:
    """The message, without the fields this version does not know."""
    msg = pb.GenerateRequest.FromString(data) if isinstance(data, bytes) else data
    copy = pb.GenerateRequest()
    copy.CopyFrom(msg)
    copy.DiscardUnknownFields()
    return copy


def unknown_top(data: bytes) -> list[bytes]:
    """The top-level unknown fields, in order, as written."""
    buf = memoryview(data)
    return [bytes(buf[f.start : f.end]) for f in fields(buf) if f.number in UNKNOWN_NUMBERS]


@given(protos(), st.integers(0, 2**32))
def test_the_scrambler_writes_the_same_message(msg: pb.GenerateRequest, seed: int) -> None:
    # The properties below are only as good as this: a scrambled message is the message.
    assert known(scrambled(msg, seed)) == known(msg)


@given(protos(), st.integers(0, 2**32))
def test_the_reader_agrees_with_the_message_view(msg: pb.GenerateRequest, seed: int) -> None:
    data = scrambled(msg, seed)
    request = raw.read_request(data)
    parsed = pd_policy_grpc.parse_generate_request(data)
    assert request.view() == pd_policy_grpc.request_view(parsed)
    assert request.facts() == pd_policy_grpc.read_facts(parsed)
    assert request.n == parsed.sampling_params.n


@given(protos(), st.integers(0, 2**32), workers)
def test_the_decode_leg_in_bytes_is_the_message_leg(
    msg: pb.GenerateRequest, seed: int, worker: WorkerCapability
) -> None:
    data = scrambled(msg, seed)
    request = raw.read_request(data)
    parsed = pb.GenerateRequest.FromString(data)
    for capability in (worker, METADATA):
        try:
            form, expected = pd_policy_grpc.build_decode_leg(parsed, capability)
        except PolicyError as exc:
            with pytest.raises(type(exc)):
                raw.build_decode_leg(request, capability)
            continue
        got_form, leg = raw.build_decode_leg(request, capability)
        assert got_form is form
        out = bytes(leg)
        assert known(out) == known(expected)
        assert unknown_top(out) == unknown_top(data)  # carried, where the message leg drops them


@given(protos(), st.integers(0, 2**32), st.sampled_from(MODES))
def test_the_prefill_leg_in_bytes_is_the_message_leg(
    msg: pb.GenerateRequest, seed: int, kv: PrefillKv
) -> None:
    data = scrambled(msg, seed)
    request = raw.read_request(data)
    handoff = plan_kv_handoff(kv, n=1, transfer_id="xfer-1")
    expected = pd_policy_grpc.prefill_leg(pb.GenerateRequest.FromString(data), handoff)
    out = bytes(raw.prefill_leg(request, handoff))
    assert known(out) == known(expected)
    assert unknown_top(out) == unknown_top(data)


@given(protos(), st.integers(0, 2**32), workers, st.sampled_from(MODES), st.data())
def test_the_handoff_in_bytes_is_the_message_handoff(
    msg: pb.GenerateRequest, seed: int, worker: WorkerCapability, kv: PrefillKv, data: st.DataObject
) -> None:
    wire = scrambled(msg, seed)
    request = raw.read_request(wire)
    parsed = pb.GenerateRequest.FromString(wire)
    try:
        form, expected = pd_policy_grpc.build_decode_leg(parsed, worker)
    except PolicyError:
        return
    _, leg = raw.build_decode_leg(request, worker)
    handoff = plan_kv_handoff(kv, n=parsed.sampling_params.n, transfer_id="xfer-2")
    expected = pd_policy_grpc.apply_kv_handoff(expected, handoff)
    leg = raw.apply_kv_handoff(leg, handoff)
    complete = pb.GenerateComplete()
    if data.draw(st.booleans()):
        complete.kv_transfer_params_json = data.draw(st.sampled_from(["", '{"a": 1}']))
    if data.draw(st.booleans()):
        complete.kv_transfer_params.SetInParent()
        complete.kv_transfer_params.remote_port = data.draw(st.integers(0, 9))
    expected = pd_policy_grpc.relay_kv(expected, complete)
    leg = raw.relay_kv(leg, complete)
    assert known(bytes(leg)) == known(expected)

    def fires(check: object, *args: object) -> bool:
        try:
            check(*args)  # type: ignore[operator]
        except PolicyError as exc:
            assert exc.status == 502
            return True
        return False

    for mode in KvConnectorMode:
        assert fires(raw.ensure_kv_handoff, request, form, leg, mode) == fires(
            pd_policy_grpc.ensure_kv_handoff, parsed, form, expected, mode
        )


def _agree(data: bytes) -> None:
    """The reader refuses exactly what parsing and checking refuse, with the same error."""
    try:
        parsed = pd_policy_grpc.parse_generate_request(data)
    except MalformedRequest as exc:
        with pytest.raises(MalformedRequest) as caught:
            raw.read_request(data)
        assert caught.value.status == 400
        assert (caught.value.param == exc.param) or exc.param == "request"
        return
    assert raw.read_request(data).view() == pd_policy_grpc.request_view(parsed)


@fuzz
@given(st.binary(max_size=300))
@counted
def test_random_bytes_are_refused_as_the_runtime_refuses_them(data: bytes) -> None:
    _agree(data)


@fuzz
@given(protos(), st.integers(0, 2**32), st.data())
@counted
def test_cut_and_edited_messages_are_refused_as_the_runtime_refuses_them(
    msg: pb.GenerateRequest, seed: int, data: st.DataObject
) -> None:
    wire = bytearray(scrambled(msg, seed))
    if data.draw(st.booleans()):
        del wire[data.draw(st.integers(0, len(wire))) :]
    for _ in range(data.draw(st.integers(0, 3))):
        if wire:
            wire[data.draw(st.integers(0, len(wire) - 1))] = data.draw(st.integers(0, 255))
    _agree(bytes(wire))


def test_every_cut_of_a_message_is_refused_as_the_runtime_refuses_it() -> None:
    # Every cut, not a drawn one: a length that runs one byte past its message is one
    # position in a few hundred, which a random cut rarely reaches.
    msg = to_proto(image_request())
    msg.mm_inputs.pixel_values.inline = bytes(range(64))
    wire = msg.SerializeToString()
    for cut in range(len(wire)):
        _agree(wire[:cut])


def big_request(megabytes: int) -> bytes:
    msg = to_proto(image_request())
    msg.mm_inputs.pixel_values.inline = bytes(megabytes << 20)
    return msg.SerializeToString()


def test_reading_and_cutting_legs_copy_no_payload() -> None:
    data = big_request(16)
    tracemalloc.start()
    try:
        request = raw.read_request(data)
        handoff = plan_kv_handoff(PrefillKv(KvConnectorMode.NIXL), n=1)
        prefill = raw.prefill_leg(request, handoff)
        _, decode = raw.build_decode_leg(request, WorkerCapability(VisionSupport.FALSE))
        _, peak = tracemalloc.get_traced_memory()
        assert peak < 1 << 20, f"{peak} bytes allocated reading a 16 MiB request"
        out = bytes(prefill)  # the one copy: the bytes handed to the transport
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(data) + (2 << 20)
    assert decode.nbytes < 4096
    assert pb.GenerateRequest.FromString(out).mm_inputs.pixel_values.inline == bytes(16 << 20)

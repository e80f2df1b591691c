"""Wire messages for the gRPC adapter's tests: core requests written as ``GenerateRequest``.

Payload bytes are fabricated (zeros, capped in size): the policy never reads them.

A third of the multimodal messages carry every batch in ``extra_mm_inputs`` and no
``mm_inputs``: the wire allows it, the core's view is the same request, and code that
assumes the primary batch is set breaks only on such a message.
"""

from __future__ import annotations

from typing import Final

from hypothesis import event, reject
from hypothesis import strategies as st

from pd_policy import MROPE_GRID_KEYS, Request
from pd_policy_grpc.wire import pb
from strategies import requests
from wire_messages import tensor_to_proto, to_proto

__all__ = [
    "EXTRAS_ONLY",
    "EXTRAS_ONLY_GRID",
    "NEGATIVE_VARINT",
    "ON_THE_WIRE_MM",
    "extras_only",
    "proto_cases",
    "protos",
    "tensor_to_proto",
    "to_proto",
    "wire_message",
]

EXTRAS_ONLY: Final = "case: extra batches without a primary batch"
EXTRAS_ONLY_GRID: Final = "case: an M-RoPE grid in extra batches without a primary batch"
ON_THE_WIRE_MM: Final = "reach: multimodal batches on the wire"
NEGATIVE_VARINT: Final = "reach: a negative int32 at the top level (a ten-byte varint)"
_ranks = st.sampled_from([3, 0, -1, -1, -(2**31), 2**31 - 1])


def extras_only(msg: pb.GenerateRequest) -> None:
    """Move the primary batch to the front of ``extra_mm_inputs`` (in place): same batches,
    same order, no ``mm_inputs``."""
    if not msg.HasField("mm_inputs"):
        return
    moved = [pb.MultimodalInputs(), *(pb.MultimodalInputs() for _ in msg.extra_mm_inputs)]
    moved[0].CopyFrom(msg.mm_inputs)
    for target, extra in zip(moved[1:], msg.extra_mm_inputs, strict=True):
        target.CopyFrom(extra)
    msg.ClearField("mm_inputs")
    del msg.extra_mm_inputs[:]
    msg.extra_mm_inputs.extend(moved)


def wire_message(draw: st.DrawFn, request: Request) -> pb.GenerateRequest:
    """``request`` as a wire message, its batches a third of the time all extras; rejects a
    request the wire cannot carry (a lone surrogate: proto strings must be UTF-8)."""
    wire_n = 0 if request.n == 1 and draw(st.booleans()) else None
    try:
        msg = to_proto(request, unspecified_image=draw(st.booleans()), wire_n=wire_n)
    except UnicodeEncodeError:
        reject()
    if draw(st.sampled_from([False, False, True])):
        extras_only(msg)
    # Negative int32s are ten-byte varints on the wire (vLLM's "any rank" is -1): at the
    # top level and in the sampling parameters. (Inside a batch the scrambler's decoys
    # put them: a batch has no signed field that a valid request sets negative.)
    msg.data_parallel_rank = draw(_ranks)
    if draw(st.booleans()):
        msg.sampling_params.seed = draw(_ranks)
    if msg.data_parallel_rank < 0:
        event(NEGATIVE_VARINT)
    return msg


@st.composite
def protos(draw: st.DrawFn, *, mm: bool | None = None) -> pb.GenerateRequest:
    return wire_message(draw, draw(requests(mm=mm)))


def proto_cases(msg: pb.GenerateRequest) -> list[str]:
    """The wire cases ``msg`` is, and what it can reach."""
    primary = msg.HasField("mm_inputs")
    if not (primary or len(msg.extra_mm_inputs)):
        return []
    if primary:
        return [ON_THE_WIRE_MM]
    grid = any(
        key in MROPE_GRID_KEYS for e in msg.extra_mm_inputs for key in e.model_specific_tensors
    )
    return [ON_THE_WIRE_MM, EXTRAS_ONLY] + ([EXTRAS_ONLY_GRID] if grid else [])


def note_proto(msg: pb.GenerateRequest) -> None:
    for case in proto_cases(msg):
        event(case)

"""The SMG vLLM engine protos, imported from ``smg-grpc-proto`` (never vendored).

One place names the generated modules, so a move inside that package is a
one-line change. The typed import path is ``smg_grpc_proto.generated``; the
package's lazy top-level attributes are invisible to type checkers.
"""

from __future__ import annotations

from typing import Final

from smg_grpc_proto.generated import common_pb2 as common
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from pd_policy import Modality

__all__ = [
    "MM_FIELDS",
    "WIRE_MODALITIES",
    "common",
    "modality_from_wire",
    "modality_to_wire",
    "pb",
    "pb_grpc",
]

#: The ``GenerateRequest`` fields that carry multimodal input.
MM_FIELDS: Final = frozenset({"mm_inputs", "extra_mm_inputs", "media_refs"})

_FROM_WIRE: Final[dict[int, Modality]] = {
    common.MODALITY_UNSPECIFIED: Modality.IMAGE,  # the wire's unspecified means image
    common.IMAGE: Modality.IMAGE,
    common.AUDIO: Modality.AUDIO,
    common.VIDEO: Modality.VIDEO,
}
#: The wire modality values this version of the proto knows.
WIRE_MODALITIES: Final = frozenset(_FROM_WIRE)

_TO_WIRE: Final[dict[Modality, int]] = {
    Modality.IMAGE: common.IMAGE,
    Modality.AUDIO: common.AUDIO,
    Modality.VIDEO: common.VIDEO,
}


def modality_from_wire(value: int) -> Modality | None:
    """The core modality of a wire enum value; ``None`` for a value this version does not know."""
    return _FROM_WIRE.get(value)


def modality_to_wire(modality: Modality) -> int:
    """The wire enum value of a core modality."""
    return _TO_WIRE[modality]

"""Core requests written as SMG ``GenerateRequest`` messages, for tests on the wire.

Payload bytes are fabricated (zeros, capped in size): the policy never reads them.
"""

from __future__ import annotations

import math

from pd_policy import PayloadLocation, Request, TensorDescriptor
from pd_policy_grpc.wire import common, modality_to_wire, pb

__all__ = ["tensor_to_proto", "to_proto"]

_ITEMSIZE = {"float32": 4, "int64": 8}


def tensor_to_proto(t: TensorDescriptor, *, cap: int = 1 << 12) -> pb.TensorData:
    data = pb.TensorData(shape=t.shape, dtype=t.dtype)
    if t.location is PayloadLocation.INLINE:
        declared = math.prod(t.shape) * _ITEMSIZE.get(t.dtype, 0)
        data.inline = bytes(min(declared, cap))
    elif t.location is PayloadLocation.SHM:
        data.shm.CopyFrom(common.ShmHandle(name="/pd-shm", offset=0, nbytes=t.nbytes, owner_id="o"))
    elif t.location is PayloadLocation.REMOTE:
        data.remote.CopyFrom(
            common.RemoteTensorHandle(transport="t", descriptor=b"d", nbytes=t.nbytes)
        )
    return data


def to_proto(
    request: Request, *, unspecified_image: bool = False, wire_n: int | None = None
) -> pb.GenerateRequest:
    """``request`` as a wire message (its KV JSON text and legacy pair included)."""
    msg = pb.GenerateRequest(request_id=request.request_id, stream=True)
    if request.input_ids is not None:
        msg.tokenized.input_ids.extend(request.input_ids)
        msg.tokenized.original_text = "original"
    else:
        assert request.text is not None
        msg.text = request.text
    msg.sampling_params.n = request.n if wire_n is None else wire_n
    msg.sampling_params.temperature = 0.5
    msg.sampling_params.max_tokens = 7
    msg.sampling_params.stop.append("STOP")
    for i, batch in enumerate(request.batches):
        wire = pb.MultimodalInputs(
            mm_hashes=batch.mm_hashes,
            batched_keys=batch.batched_keys,
            keep_on_cpu_keys=batch.keep_on_cpu_keys,
            flat_keys=dict(batch.flat_keys),
        )
        modality = modality_to_wire(batch.modality)
        wire.modality = (
            common.MODALITY_UNSPECIFIED
            if unspecified_image and modality == common.IMAGE
            else modality
        )
        if batch.pixel_values is not None:
            wire.pixel_values.CopyFrom(tensor_to_proto(batch.pixel_values))
        for t in batch.tensors:
            wire.model_specific_tensors[t.name].CopyFrom(tensor_to_proto(t))
        for p in batch.placeholders:
            wire.mm_placeholders.add(offset=p.offset, length=p.length)
        if batch.im_token_id is not None:
            wire.im_token_id = batch.im_token_id
        if batch.encoder_input_key is not None:
            wire.encoder_input_key = batch.encoder_input_key
        if i == 0:
            msg.mm_inputs.CopyFrom(wire)
        else:
            msg.extra_mm_inputs.append(wire)
    for ref in request.media_refs:
        msg.media_refs.items.add(modality=modality_to_wire(ref.modality), url=ref.url)
    if request.kv_transfer_params is not None:
        msg.kv_transfer_params_json = request.kv_transfer_params
    if request.kv_legacy is not None:
        msg.kv_transfer_params.remote_host = request.kv_legacy.remote_host
        msg.kv_transfer_params.remote_port = request.kv_legacy.remote_port
    msg.data_parallel_rank = 3
    return msg

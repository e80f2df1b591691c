"""The bench's wire requests: 8 images, 4096 ids, a 64-digit hash per image, any size of
pixels. Token ids spread over a 151k vocabulary, so their varints take 3 bytes on the wire,
as real ids do."""

from __future__ import annotations

from typing import Final

from pd_policy_grpc.wire import common, pb

MIB: Final = 1 << 20
IMAGES: Final = 8
IDS: Final = 4096
#: The image placeholder id of the wire requests (Qwen2-VL's <|image_pad|>).
PLACEHOLDER_ID: Final = 151655
#: The KV handoff a prefill relays, as the decode leg carries it.
KV: Final = (
    '{"do_remote_prefill":true,"do_remote_decode":false,"transfer_id":"xfer-0123456789abcdef"}'
)


def token_ids(count: int, *, images: int, per: int) -> list[int]:
    """Deterministic token ids with one placeholder run of ``per`` per image."""
    state, ids = 12345, []
    for _ in range(count):
        state = (1103515245 * state + 12345) % 2**31
        ids.append(state % 151000)
    for i in range(images):
        ids[i * per : (i + 1) * per] = [PLACEHOLDER_ID] * per
    return ids


def wire_request(
    pixel_bytes: int, *, one_byte_ids: bool = False, kv: bool = True
) -> pb.GenerateRequest:
    """The bench's request. ``one_byte_ids``: every id is 7, as the first bench had it
    (1-byte varints make serializing the ids about 10 times cheaper). ``kv``: it carries the
    relayed handoff, as a decode leg does; a client's request does not."""
    per = IDS // (IMAGES + 1)
    ids = [7] * IDS if one_byte_ids else token_ids(IDS, images=IMAGES, per=per)
    msg = pb.GenerateRequest(request_id="bench", tokenized=pb.TokenizedInput(input_ids=ids))
    msg.sampling_params.max_tokens = 64
    msg.sampling_params.temperature = 0.0
    batch = msg.mm_inputs
    batch.modality = common.IMAGE
    batch.pixel_values.shape.extend([IMAGES, max(pixel_bytes // IMAGES // 4, 0)])
    batch.pixel_values.dtype = "float32"
    batch.pixel_values.inline = bytes(pixel_bytes)
    for i in range(IMAGES):
        batch.mm_placeholders.add(offset=i * per, length=per)
        batch.mm_hashes.append(f"{i:064x}")
    if kv:
        msg.kv_transfer_params_json = KV
    return msg


def wire_mrope_request(pixel_bytes: int) -> pb.GenerateRequest:
    """The bench's request as a Qwen2-VL router sends it: an inline ``image_grid_thw`` too."""
    msg = wire_request(pixel_bytes)
    grid = msg.mm_inputs.model_specific_tensors["image_grid_thw"]
    grid.shape.extend([IMAGES, 3])
    grid.dtype = "int64"
    grid.inline = bytes(IMAGES * 3 * 8)
    msg.mm_inputs.keep_on_cpu_keys.append("image_grid_thw")
    return msg

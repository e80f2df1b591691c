"""Building a stripped leg never copies a payload it drops: measured by size, not time."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

import pd_policy_grpc
from pd_policy import VisionSupport, WorkerCapability
from pd_policy_grpc.wire import common, pb

IMAGES, IDS = 8, 4096
MIB = 1 << 20


def big_request(pixel_bytes: int, *, grids: bool = False) -> pb.GenerateRequest:
    """8 images behind 4096 expanded ids, ``pixel_bytes`` of inline pixels in all."""
    per_image = IDS // (IMAGES + 1)
    request = pb.GenerateRequest(request_id="big", tokenized=pb.TokenizedInput(input_ids=[7] * IDS))
    batch = request.mm_inputs
    batch.modality = common.IMAGE
    batch.pixel_values.shape.extend([IMAGES, pixel_bytes // IMAGES // 4])
    batch.pixel_values.dtype = "float32"
    batch.pixel_values.inline = bytes(pixel_bytes)
    for i in range(IMAGES):
        batch.mm_placeholders.add(offset=i * per_image, length=per_image)
        batch.mm_hashes.append(f"{i:064x}")
    if grids:
        batch.model_specific_tensors["image_grid_thw"].shape.extend([IMAGES, 3])
        batch.model_specific_tensors["image_grid_thw"].dtype = "int64"
        batch.model_specific_tensors["image_grid_thw"].inline = bytes(IMAGES * 3 * 8)
    request.kv_transfer_params_json = '{"do_remote_prefill":true}'
    return request


def traced_peak(build: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        kept = build()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    del kept
    return peak


def test_the_measurement_sees_a_payload_copy() -> None:
    # The control: reading `inline` copies 64 MiB into a Python object, and the
    # measurement sees it. Without this, a flat peak below would prove nothing.
    request = big_request(64 * MIB)
    assert traced_peak(lambda: request.mm_inputs.pixel_values.inline) >= 64 * MIB


@pytest.mark.parametrize(
    ("support", "grids"),
    [(VisionSupport.FALSE, False), (VisionSupport.TRUE, False), (VisionSupport.TRUE, True)],
)
def test_leg_cost_does_not_grow_with_pixels(support: VisionSupport, grids: bool) -> None:
    worker = WorkerCapability(support)
    small, large = big_request(0, grids=grids), big_request(64 * MIB, grids=grids)
    small_leg = pd_policy_grpc.build_decode_leg(small, worker)[1]
    large_leg = pd_policy_grpc.build_decode_leg(large, worker)[1]
    # The leg holds no pixels: it is exactly as large for 0 and 64 MiB of them.
    assert large_leg.ByteSize() == small_leg.ByteSize() < 64 * 1024
    peak_small = traced_peak(lambda: pd_policy_grpc.build_decode_leg(small, worker))
    peak_large = traced_peak(lambda: pd_policy_grpc.build_decode_leg(large, worker))
    assert peak_large < 256 * 1024
    assert peak_large <= peak_small * 1.5 + 16 * 1024


def test_the_view_copies_no_payload() -> None:
    request = big_request(64 * MIB)
    assert traced_peak(lambda: pd_policy_grpc.request_view(request)) < 2 * MIB
    view = pd_policy_grpc.request_view(request)
    pixels = view.batches[0].pixel_values
    assert pixels is not None
    assert pixels.nbytes == 64 * MIB  # declared by shape and dtype, never read

"""M-RoPE on a language-model-only decode worker that takes multimodal metadata."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pd_policy import (
    MROPE_GRID_KEYS,
    DecodeForm,
    KvConnectorMode,
    MissingKvTransferParams,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    PayloadLocation,
    Request,
    Support,
    WorkerCapability,
    build_decode_leg,
    decode_cache_salt,
    ensure_kv_handoff,
    ensure_language_model_only_leg,
    metadata_only,
    relay_kv,
)
from pd_policy.tools.outcome import PrefillResult, plan
from strategies import kv_objects, metadata_requests

TAKES = WorkerCapability(Support.FALSE, accepts_mm_metadata=Support.TRUE)
KV = '{"do_remote_prefill":true,"transfer_id":"x"}'


@given(metadata_requests())
def test_a_complete_request_is_served_with_metadata_only(request: Request) -> None:
    form, leg = build_decode_leg(request, TAKES)
    assert form is DecodeForm.MROPE_METADATA
    assert (leg.input_ids, leg.kv_transfer_params, leg.cache_salt, leg.media_refs) == (
        request.input_ids, request.kv_transfer_params, request.cache_salt, (),
    )  # fmt: skip
    for before, after in zip(request.batches, leg.batches, strict=True):
        assert after.pixel_values is None
        assert (after.mm_hashes, after.placeholders) == (before.mm_hashes, before.placeholders)
        grids = {t.name for t in before.tensors if t.name in MROPE_GRID_KEYS}
        sizes = {s for g, s in before.flat_keys if g in grids}
        assert set(after.tensor_names) == grids | sizes  # grids and their sizes, nothing else
        assert grids <= set(after.keep_on_cpu_keys)
    # The caller's salt is passed as is: vLLM keys the blocks by the hashes itself.
    assert decode_cache_salt(leg) == request.cache_salt
    assert metadata_only(leg) == leg  # a metadata leg is its own metadata leg


@given(metadata_requests(), kv_objects)
def test_the_handoff_and_the_guard_hold_on_the_metadata_leg(
    request: Request, returned: dict[str, object]
) -> None:
    bare = request.derive(kv_transfer_params=None)
    form, leg = build_decode_leg(bare, TAKES)
    with pytest.raises(MissingKvTransferParams):
        # No handoff: a 502 before decode is called.
        ensure_kv_handoff(bare, form, leg, KvConnectorMode.TRANSFER)
    with pytest.raises(MissingKvTransferParams):
        ensure_language_model_only_leg(leg, uses_mrope=True, takes_mm_metadata=True)
    # Whatever else the connector returns, the transfer it names is the handoff.
    relayed = relay_kv(leg, {**returned, "do_remote_prefill": True, "transfer_id": "t"})
    ensure_kv_handoff(bare, form, relayed, KvConnectorMode.TRANSFER)
    ensure_language_model_only_leg(relayed, uses_mrope=True, takes_mm_metadata=True)
    # A worker without the fact refuses the same leg, as today.
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        ensure_language_model_only_leg(relayed, uses_mrope=True)
    assert plan(bare, TAKES, PrefillResult.nothing()).status == 502


gaps = st.sampled_from(["text", "hashes", "shm_grid", "remote_sizes", "placeholders", "no_grid"])


def with_gap(request: Request, gap: str, index: int) -> tuple[Request, str]:
    batches = list(request.batches)
    batch = batches[index]
    where = f"batches[{index}]"
    if gap == "text":
        stripped = [attrs.evolve(b, placeholders=()) for b in batches]
        return request.derive(input_ids=None, text="t", batches=stripped), "input_ids"
    if gap == "hashes":
        batches[index] = attrs.evolve(batch, mm_hashes=(), placeholders=())
        return request.derive(batches=batches), f"{where}.mm_hashes"
    grid = next(t for t in batch.tensors if t.name in MROPE_GRID_KEYS)
    others = [t for t in batch.tensors if t.name != grid.name]
    if gap == "shm_grid":
        moved = attrs.evolve(grid, location=PayloadLocation.SHM)
        batches[index] = attrs.evolve(batch, tensors=[moved, *others])
        return request.derive(batches=batches), f"{where}.tensors.{grid.name}"
    if gap == "remote_sizes":
        sizes = attrs.evolve(grid, name="far_sizes", location=PayloadLocation.REMOTE)
        flat = {**dict(batch.flat_keys), grid.name: "far_sizes"}
        batches[index] = attrs.evolve(batch, tensors=[*batch.tensors, sizes], flat_keys=flat)
        return request.derive(batches=batches), f"{where}.tensors.{grid.name}"
    if gap == "placeholders":
        batches[index] = attrs.evolve(batch, placeholders=())
        return request.derive(batches=batches), f"{where}.placeholders"
    keep = [t for t in batch.tensors if t.name not in MROPE_GRID_KEYS]
    batches[index] = attrs.evolve(batch, tensors=keep, flat_keys={}, keep_on_cpu_keys=())
    return request.derive(batches=batches), f"{where}.tensors"


@given(metadata_requests(), gaps, st.data())
def test_anything_missing_is_the_mrope_400_naming_it(
    request: Request, gap: str, data: st.DataObject
) -> None:
    index = data.draw(st.integers(0, len(request.batches) - 1))
    broken, param = with_gap(request, gap, index)
    if gap == "no_grid" and not any(
        t.name in MROPE_GRID_KEYS for b in broken.batches for t in b.tensors
    ):
        return  # no grid left anywhere: not an M-RoPE request (the text-plus-hashes path)
    with pytest.raises(MropeOnLanguageModelOnlyDecode) as caught:
        build_decode_leg(broken, TAKES)
    assert caught.value.status == 400 and not caught.value.retryable
    assert caught.value.param == param
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        metadata_only(broken)


@given(metadata_requests())
def test_what_stays_refused(request: Request) -> None:
    with pytest.raises(NSamplesOnLanguageModelOnlyDecode):
        build_decode_leg(request.derive(n=2), TAKES)
    for unknown in (Support.UNKNOWN, Support.FALSE):
        worker = WorkerCapability(Support.FALSE, accepts_mm_metadata=unknown)
        with pytest.raises(MropeOnLanguageModelOnlyDecode):
            build_decode_leg(request, worker)
    # A vision-capable worker that says it takes metadata keeps today's identity-only leg.
    vision = WorkerCapability(Support.TRUE, accepts_mm_metadata=Support.TRUE)
    assert build_decode_leg(request, vision)[0] is DecodeForm.IDENTITY_ONLY

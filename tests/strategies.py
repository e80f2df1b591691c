"""Hypothesis strategies for core requests and workers, valid by construction.

Shapes are chosen to reach every branch: grids with and without payload, sizes
tensors inline or not, hash-less batches, media references, n of 0..3, both
KV forms, caller salts, and adversarial strings in hashes and salts.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from pd_policy import (
    MROPE_GRID_KEYS,
    LegacyKvParams,
    MediaRef,
    Modality,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    Request,
    TensorDescriptor,
    VisionSupport,
    WorkerCapability,
)

#: Strings built to break naive encodings: separators, prefixes, surrogates, NULs.
adversarial_text = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(["a,b", "a", "b", ",", ":", "mm:", "mm1:", "\x00", "a\x00b", "\ud800", "é"]),
    st.builds(lambda a, b: a + "," + b, st.text(max_size=4), st.text(max_size=4)),
)
hashes = st.one_of(st.text(alphabet="0123456789abcdef", min_size=1, max_size=64), adversarial_text)

TENSOR_NAMES = [*sorted(MROPE_GRID_KEYS), "image_sizes", "aspect_ratios", "patch_sizes", "x"]
locations = st.sampled_from(list(PayloadLocation))


@st.composite
def tensors(draw: st.DrawFn, name: str) -> TensorDescriptor:
    location = draw(locations)
    nbytes = 0 if location is PayloadLocation.NONE else draw(st.integers(0, 1 << 26))
    shape = tuple(draw(st.lists(st.integers(0, 64), max_size=3)))
    return TensorDescriptor(
        name, shape, draw(st.sampled_from(["float32", "int64"])), location, nbytes
    )


@st.composite
def batches(draw: st.DrawFn, n_ids: int) -> MultimodalBatch:
    items = draw(st.integers(0, 3))
    placeholders: list[PlaceholderRange] = []
    if n_ids and draw(st.booleans()):
        for _ in range(items):
            offset = draw(st.integers(0, n_ids - 1))
            placeholders.append(PlaceholderRange(offset, draw(st.integers(1, n_ids - offset))))
    item_hashes = (
        draw(st.lists(hashes, min_size=items, max_size=items)) if draw(st.booleans()) else []
    )
    names = draw(st.lists(st.sampled_from(TENSOR_NAMES), unique=True, max_size=4))
    tensor_list = [draw(tensors(name)) for name in names]
    pixels = draw(st.none() | tensors("pixel_values"))
    all_keys = [*names, "pixel_values"]
    flat: dict[str, str] = {}
    for name in names:
        if draw(st.booleans()):
            flat[name] = draw(st.sampled_from([*all_keys, "missing_sizes"]))
    return MultimodalBatch(
        modality=draw(st.sampled_from(list(Modality))),
        pixel_values=pixels,
        tensors=tensor_list,
        placeholders=placeholders,
        mm_hashes=item_hashes,
        im_token_id=draw(st.none() | st.integers(0, 2**32 - 1)),
        batched_keys=draw(st.lists(st.sampled_from(all_keys), unique=True, max_size=3)),
        flat_keys=flat,
        keep_on_cpu_keys=draw(st.lists(st.sampled_from(all_keys), unique=True, max_size=3)),
        encoder_input_key=draw(st.none() | st.sampled_from(["pixel_values", "image_embeds"])),
    )


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**31), 2**31), st.text(max_size=8)
)
kv_objects = st.dictionaries(
    st.text(max_size=8), json_scalars | st.lists(json_scalars, max_size=3), max_size=4
)


@st.composite
def requests(draw: st.DrawFn, *, mm: bool | None = None) -> Request:
    tokenized = draw(st.booleans()) or mm is True
    ids = draw(st.lists(st.integers(0, 2**32 - 1), max_size=40)) if tokenized else None
    kind = (
        draw(st.sampled_from(["none", "batches", "refs"]))
        if mm is None
        else ("batches" if mm else "none")
    )
    batch_list: list[MultimodalBatch] = []
    refs: list[MediaRef] = []
    if kind == "batches":
        batch_list = draw(
            st.lists(batches(len(ids) if ids is not None else 0), min_size=1, max_size=3)
        )
    elif kind == "refs" and ids is not None:
        refs = draw(
            st.lists(
                st.builds(
                    MediaRef,
                    st.sampled_from(list(Modality)),
                    st.sampled_from(["https://x/a.png", "s3://b/c", "data:image/png;base64,AA"]),
                ),
                min_size=1,
                max_size=2,
            )
        )
    if ids is None:
        # Placeholders need ids; a text request keeps only placeholder-free batches.
        batch_list = [b for b in batch_list if not b.placeholders]
    kv: Any = draw(st.none() | kv_objects)
    legacy = draw(
        st.none() | st.builds(LegacyKvParams, st.text(max_size=10), st.integers(0, 65535))
    )
    return Request(
        request_id=draw(st.text(max_size=12)),
        input_ids=ids,
        text=None if ids is not None else draw(st.text(max_size=20)),
        batches=batch_list,
        media_refs=refs,
        n=draw(st.integers(0, 3)),
        kv_transfer_params=kv,
        kv_legacy=legacy,
        cache_salt=draw(st.none() | adversarial_text),
    )


workers = st.builds(
    WorkerCapability,
    st.sampled_from(list(VisionSupport)),
    st.sampled_from(["", "inprocess", "redis"]),
    st.lists(st.sampled_from(["http", "https", "data", "s3"]), unique=True, max_size=3),
    st.sampled_from(list(VisionSupport)),
)


@st.composite
def metadata_requests(draw: st.DrawFn) -> Request:
    """M-RoPE requests complete for a worker that takes multimodal metadata: tokenized, and
    every batch with hashes, one placeholder range per item and an inline grid (some
    flattened by an inline sizes tensor), plus pixels and other tensors the leg must drop."""
    ids = draw(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=40))
    batch_list = []
    for _ in range(draw(st.integers(1, 3))):
        items = draw(st.integers(1, 3))
        placeholders = []
        for _ in range(items):
            offset = draw(st.integers(0, len(ids) - 1))
            placeholders.append(PlaceholderRange(offset, draw(st.integers(1, len(ids) - offset))))
        grid_names = draw(
            st.lists(st.sampled_from(sorted(MROPE_GRID_KEYS)), min_size=1, max_size=2, unique=True)
        )
        tensor_list = [
            TensorDescriptor(name, (items, 3), "int64", PayloadLocation.INLINE, items * 24)
            for name in grid_names
        ]
        flat: dict[str, str] = {}
        if draw(st.booleans()):
            tensor_list.append(
                TensorDescriptor("grid_sizes", (items,), "int64", PayloadLocation.INLINE, 8)
            )
            flat[grid_names[0]] = "grid_sizes"
        if draw(st.booleans()):
            tensor_list.append(draw(tensors("image_sizes")))
        batch_list.append(
            MultimodalBatch(
                modality=draw(st.sampled_from(list(Modality))),
                pixel_values=draw(st.none() | tensors("pixel_values")),
                tensors=tensor_list,
                placeholders=placeholders,
                mm_hashes=draw(st.lists(hashes, min_size=items, max_size=items)),
                im_token_id=draw(st.none() | st.integers(0, 2**32 - 1)),
                batched_keys=draw(st.lists(st.sampled_from(grid_names), unique=True)),
                flat_keys=flat,
                keep_on_cpu_keys=draw(st.lists(st.sampled_from(grid_names), unique=True)),
            )
        )
    return Request(
        request_id=draw(st.text(max_size=12)),
        input_ids=ids,
        batches=batch_list,
        n=draw(st.sampled_from([0, 1])),
        kv_transfer_params=draw(st.none() | kv_objects),
        cache_salt=draw(st.none() | adversarial_text),
    )

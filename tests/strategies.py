"""Hypothesis strategies for core requests and workers, valid by construction.

Shapes are chosen to reach every branch: grids with and without payload, sizes
tensors inline or not, hash-less batches, media references, n of 0..3 and up to
the wire's uint32 bound, both KV forms, caller salts, and adversarial strings in
hashes and salts.

The weights are explicit, not left to independent coin flips: each interesting
case must show up in at least a tenth of the examples that can reach it
(``tests/test_strategy_rates.py`` measures this). Independent flips made the
cases that need several facts at once (a stripped multimodal leg whose prefill
returned nothing) rarer than one example in a hundred. :func:`request_cases`
and :func:`decision_cases` name the cases; the properties report them with
``hypothesis.event`` (see ``--hypothesis-show-statistics``).
"""

from __future__ import annotations

import functools
from typing import Any, Final

from hypothesis import event
from hypothesis import strategies as st

from pd_policy import (
    MROPE_GRID_KEYS,
    EncoderCacheRole,
    LegacyKvParams,
    MediaRef,
    MissingMediaIdentity,
    Modality,
    MropeOnLanguageModelOnlyDecode,
    MultimodalBatch,
    PayloadLocation,
    PlaceholderRange,
    PolicyError,
    Request,
    TensorDescriptor,
    VisionSupport,
    WorkerCapability,
    sequential_pd_decode_form,
)
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy.tools.outcome import PrefillResult

#: The largest value of a uint32 wire field (token ids, n, offsets): the core's bound.
UINT32_MAX: Final = 2**32 - 1

#: Strings built to break naive encodings: separators, prefixes, the fold's own tag letters,
#: surrogates, NULs, composed and decomposed accents.
ADVERSARIAL: Final = [
    "a,b", "a", "b", ",", ":", "mm:", "mm1:", "\x00", "a\x00b", "\ud800", "é", "e\u0301",
    "I", "aIb", "+", "-",
]  # fmt: skip
adversarial_text = st.one_of(
    st.sampled_from(ADVERSARIAL),
    st.text(min_size=1, max_size=8),
    st.builds(lambda a, b: a + "," + b, st.text(max_size=3), st.text(max_size=3)),
)
# A router's hashes are 64 hex digits: one draw of a 256-bit integer, not 64 draws of a digit.
hex_digests = st.integers(0, 2**256 - 1).map(lambda v: f"{v:064x}")
hashes = st.one_of(hex_digests, adversarial_text)

GRID_NAMES: Final = sorted(MROPE_GRID_KEYS)
OTHER_TENSOR_NAMES: Final = ["image_sizes", "aspect_ratios", "patch_sizes", "x"]
TENSOR_NAMES: Final = [*GRID_NAMES, *OTHER_TENSOR_NAMES]
locations = st.sampled_from(list(PayloadLocation))
modalities = st.sampled_from(list(Modality))


# Strategies are built once, here: building one inside a draw costs its validation on every
# draw, most of a batch's cost (the fuzz profile runs 100,000 examples).
_sizes = {(lo, hi): st.integers(lo, hi) for lo in (0, 1) for hi in (3, 40)}
_starts = st.one_of(st.sampled_from([0, UINT32_MAX]), st.integers(0, UINT32_MAX))


@st.composite
def token_ids(draw: st.DrawFn, *, min_size: int = 0, max_size: int = 40) -> list[int]:
    """Token ids: a run from a drawn start, wrapping at the uint32 bound.

    The policy reads ids only for their count, their bounds and where placeholders
    point, so two draws stand in for one per id; the start reaches 0 and
    ``UINT32_MAX`` often.
    """
    sizes = _sizes.get((min_size, max_size))
    size = draw(sizes if sizes is not None else st.integers(min_size, max_size))
    start = draw(_starts)
    return [(start + i) % (UINT32_MAX + 1) for i in range(size)]


_nbytes = st.integers(0, 1 << 26)
_shapes = st.lists(st.integers(0, 64), max_size=3)
_dtypes = st.sampled_from(["float32", "int64"])


@st.composite
def tensors(draw: st.DrawFn, name: str) -> TensorDescriptor:
    location = draw(locations)
    nbytes = 0 if location is PayloadLocation.NONE else draw(_nbytes)
    shape = tuple(draw(_shapes))
    return TensorDescriptor(name, shape, draw(_dtypes), location, nbytes)


_tensors = {name: tensors(name) for name in [*TENSOR_NAMES, "pixel_values", "grid_sizes"]}


def _bounded(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.integers(lo, hi)


def placeholder_ranges(draw: st.DrawFn, n_ids: int, items: int) -> list[PlaceholderRange]:
    """``items`` ranges inside ``n_ids`` ids (``n_ids`` > 0)."""
    ranges = []
    for _ in range(items):
        offset = draw(_bounded(0, n_ids - 1))
        ranges.append(PlaceholderRange(offset, draw(_bounded(1, n_ids - offset))))
    return ranges


def subset(draw: st.DrawFn, keys: list[str]) -> list[str]:
    """Some of ``keys``, in their order or reversed: a mask and a flip, two draws where a
    unique list draws twice per key."""
    mask = draw(_bounded(0, (1 << len(keys)) - 1))
    chosen = [k for i, k in enumerate(keys) if mask >> i & 1]
    return chosen[::-1] if draw(st.booleans()) else chosen


#: What a batch carries besides its identity; "none" half the time, so that placeholder-only
#: batches (an identity leg's shape, and what the worker guard must still refuse) are common.
PAYLOADS: Final = ["none", "pixels", "none", "tensors", "both", "none"]
_payloads = st.sampled_from(PAYLOADS)
_two_in_three = st.sampled_from([True, True, False])
_item_hashes = {items: st.lists(hashes, min_size=items, max_size=items) for items in range(4)}
_grid_names = st.lists(st.sampled_from(GRID_NAMES), min_size=1, max_size=2, unique=True)
_other_names = st.lists(st.sampled_from(OTHER_TENSOR_NAMES), min_size=1, max_size=2, unique=True)
_token_id = st.none() | st.sampled_from([0, UINT32_MAX]) | st.integers(0, UINT32_MAX)
_encoder_key = st.none() | st.sampled_from(["pixel_values", "image_embeds"])


@st.composite
def batches(draw: st.DrawFn, n_ids: int, *, grid: bool | None = None) -> MultimodalBatch:
    """One batch; ``grid``: whether it has an M-RoPE grid key (``None``: drawn)."""
    items = draw(_sizes[0, 3])
    # About a third hash-less: the decision must refuse such a batch when it carries
    # media, and the leg builders drop an empty one whole.
    hashed = draw(_two_in_three)
    placed = n_ids > 0 and draw(_two_in_three)
    payload = draw(_payloads)
    if grid is not None:
        with_grid = grid
    else:  # a batch with nothing else rarely has a grid: placeholders alone are the case
        with_grid = draw(st.booleans()) if payload != "none" else not draw(_two_in_three)
    placeholders = placeholder_ranges(draw, n_ids, items) if placed else []
    item_hashes = draw(_item_hashes[items]) if hashed else []
    names: list[str] = draw(_grid_names) if with_grid else []
    if payload in ("tensors", "both"):
        names = names + draw(_other_names)
    tensor_list = [draw(_tensors[name]) for name in names]
    pixels = draw(_tensors["pixel_values"]) if payload in ("pixels", "both") else None
    all_keys = [*names, "pixel_values"]
    flat: dict[str, str] = {}
    for name in subset(draw, names):
        flat[name] = draw(st.sampled_from([*all_keys, "missing_sizes"]))
    return MultimodalBatch(
        modality=draw(modalities),
        pixel_values=pixels,
        tensors=tensor_list,
        placeholders=placeholders,
        mm_hashes=item_hashes,
        im_token_id=draw(_token_id),
        batched_keys=subset(draw, all_keys),
        flat_keys=flat,
        keep_on_cpu_keys=subset(draw, all_keys),
        encoder_input_key=draw(_encoder_key),
    )


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**31), 2**31), st.text(max_size=8)
)
kv_objects = st.dictionaries(
    st.text(max_size=8), json_scalars | st.lists(json_scalars, max_size=3), max_size=4
)
#: n as the wire sends it: 0 (unset, one sample) and 1 half the time, n>1 the other half.
n_samples = st.one_of(st.sampled_from([1, 0]), st.sampled_from([2, 3, UINT32_MAX]))
single_samples = st.sampled_from([1, 0])
legacy_kv = st.builds(LegacyKvParams, st.text(max_size=10), st.integers(0, 65535))
media_refs = st.lists(
    st.builds(
        MediaRef,
        modalities,
        st.sampled_from(["https://x/a.png", "s3://b/c", "data:image/png;base64,AA"]),
    ),
    min_size=1,
    max_size=2,
)
#: A caller's salt: none, empty (which must not alias none) or adversarial.
salts = st.sampled_from([None, ""]) | adversarial_text
request_ids = st.text(max_size=8)
texts = st.text(max_size=12)

#: A request's kind: text or plain ids (none), multimodal batches (three times as often),
#: media references, or an M-RoPE request complete for a worker that takes metadata.
KINDS: Final = ["none", "batches", "batches", "batches", "refs", "complete"]
_kinds = st.sampled_from(KINDS)
_mm_kinds = st.sampled_from(["batches", "batches", "batches", "complete"])
#: Which batches get an M-RoPE grid: none (grid-less: the text-plus-hashes path on a
#: language-model-only worker), all, or each drawn. Grid-less is most.
GRID_MODES: Final = ["none", "none", "all", "none", "mixed"]
_grid_modes = st.sampled_from(GRID_MODES)
_one_in_three = st.sampled_from([False, False, True])
_kv_forms = st.sampled_from(["json", "legacy", "both"])


@functools.cache
def _batch_lists(n_ids: int, grid: bool | None) -> st.SearchStrategy[list[MultimodalBatch]]:
    return st.lists(batches(n_ids, grid=grid), min_size=1, max_size=3)


@st.composite
def requests(
    draw: st.DrawFn,
    *,
    mm: bool | None = None,
    grids: bool | None = None,
    n: st.SearchStrategy[int] = n_samples,
    kv: bool | None = None,
) -> Request:
    """A request. ``mm``: with multimodal batches (``True``), without any media
    (``False``), or drawn; ``grids``: whether every batch has an M-RoPE grid key, or
    none does (``None``: drawn); ``kv``: whether it carries a KV handoff (``None``: drawn,
    absent two times in three)."""
    kind = draw(_kinds if mm is None else _mm_kinds if mm else st.just("none"))
    if kind == "complete" and grids is not False:
        return draw(_metadata_requests(kv, n))
    kind = "batches" if kind == "complete" else kind
    tokenized = kind == "refs" or mm is True or draw(st.booleans())
    ids = draw(token_ids()) if tokenized else None
    batch_list: list[MultimodalBatch] = []
    refs: list[MediaRef] = []
    if kind == "batches":
        mode = draw(_grid_modes) if grids is None else ("all" if grids else "none")
        grid = {"none": False, "all": True, "mixed": None}[mode]
        batch_list = draw(_batch_lists(len(ids) if ids is not None else 0, grid))
    elif kind == "refs":
        refs = draw(media_refs)
    kv_params: Any = None
    legacy = None
    if draw(_one_in_three) if kv is None else kv:
        which = draw(_kv_forms)
        kv_params = draw(kv_objects) if which != "legacy" else None
        legacy = draw(legacy_kv) if which != "json" else None
    return Request(
        request_id=draw(request_ids),
        input_ids=ids,
        text=None if ids is not None else draw(texts),
        batches=batch_list,
        media_refs=refs,
        n=draw(n),
        kv_transfer_params=kv_params,
        kv_legacy=legacy,
        cache_salt=draw(salts),
    )


support = st.sampled_from(list(VisionSupport))
#: Half of the workers language-model-only (every carve-out lives there), a quarter each
#: vision-capable and unknown.
vision_support = st.sampled_from(
    [VisionSupport.FALSE, VisionSupport.FALSE, VisionSupport.TRUE, VisionSupport.UNKNOWN]
)
#: How a decode takes KV: a third of them blind to a stripped leg (a connector that
#: matches by content hash or loads nothing, or a recompute on a failed load).
decode_kvs = st.sampled_from(
    [
        DecodeKv(),
        DecodeKv(),
        DecodeKv(KvLoad.BY_REQUEST, LoadFailure.FAIL),
        DecodeKv(KvLoad.BY_REQUEST, LoadFailure.UNKNOWN),
        DecodeKv(KvLoad.BY_CONTENT),
        DecodeKv(KvLoad.NONE, LoadFailure.FAIL),
        DecodeKv(KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE),
        DecodeKv(KvLoad.UNKNOWN, LoadFailure.FAIL),
        DecodeKv(KvLoad.UNKNOWN, LoadFailure.FAIL),
    ]
)
workers = st.builds(
    WorkerCapability,
    vision_support,
    st.sampled_from(["", "inprocess", "redis"]),
    st.lists(st.sampled_from(["http", "https", "data", "s3"]), unique=True, max_size=3),
    support,
    st.sampled_from(list(EncoderCacheRole)),
    decode_kvs,
)
#: Language-model-only workers, a third of them taking M-RoPE metadata.
lm_only_workers = st.builds(
    WorkerCapability, st.just(VisionSupport.FALSE), st.sampled_from(["", "inprocess"]),
    st.just(()), support,
)  # fmt: skip
metadata_workers = st.just(
    WorkerCapability(VisionSupport.FALSE, accepts_mm_metadata=VisionSupport.TRUE)
)

_maybe_pixels = st.none() | _tensors["pixel_values"]
_any_token_id = st.none() | st.integers(0, UINT32_MAX)


@st.composite
def metadata_requests(
    draw: st.DrawFn, *, kv: bool | None = None, n: st.SearchStrategy[int] = single_samples
) -> Request:
    """M-RoPE requests complete for a worker that takes multimodal metadata: tokenized, and
    every batch with hashes, one placeholder range per item and an inline grid (some
    flattened by an inline sizes tensor), plus pixels and other tensors the leg must drop.
    ``kv``: whether it carries KV parameters (``None``: drawn); ``n``: one sample by
    default (more is complete too, and refused for n)."""
    ids = draw(token_ids(min_size=1))
    batch_list = []
    for _ in range(draw(_sizes[1, 3])):
        items = draw(_sizes[1, 3])
        grid_names = draw(_grid_names)
        tensor_list = [
            TensorDescriptor(name, (items, 3), "int64", PayloadLocation.INLINE, items * 24)
            for name in grid_names
        ]
        flat: dict[str, str] = {}
        if draw(st.booleans()):
            tensor_list.append(
                TensorDescriptor("grid_sizes", (items,), "int64", PayloadLocation.INLINE, items * 8)
            )
            flat[grid_names[0]] = "grid_sizes"
        if draw(st.booleans()):
            tensor_list.append(draw(_tensors["image_sizes"]))
        batch_list.append(
            MultimodalBatch(
                modality=draw(modalities),
                pixel_values=draw(_maybe_pixels),
                tensors=tensor_list,
                placeholders=placeholder_ranges(draw, len(ids), items),
                mm_hashes=draw(_item_hashes[items]),
                im_token_id=draw(_any_token_id),
                batched_keys=subset(draw, grid_names),
                flat_keys=flat,
                keep_on_cpu_keys=subset(draw, grid_names),
            )
        )
    with_kv = draw(st.booleans()) if kv is None else kv
    return Request(
        request_id=draw(request_ids),
        input_ids=ids,
        batches=batch_list,
        n=draw(n),
        kv_transfer_params=draw(kv_objects) if with_kv else None,
        cache_salt=draw(salts),
    )


@functools.cache
def _metadata_requests(kv: bool | None, n: st.SearchStrategy[int]) -> st.SearchStrategy[Request]:
    return metadata_requests(kv=kv, n=n)


#: What the prefill returned: nothing, KV parameters, the legacy host and port, or both.
prefill_results = st.one_of(
    st.just(PrefillResult.nothing()),
    st.builds(PrefillResult.returned, kv_objects),
    st.builds(PrefillResult, kv_transfer_params=st.none(), kv_legacy=legacy_kv),
    st.builds(PrefillResult, kv_transfer_params=kv_objects, kv_legacy=legacy_kv),
)
prefill_nothing_mostly = st.one_of(
    st.just(PrefillResult.nothing()), st.just(PrefillResult.nothing()), prefill_results
)

#: What :func:`handoffs` aims at: anything (half), or a leg the 502 guards (a stripped
#: multimodal leg, or an M-RoPE metadata leg) from a request without KV.
HANDOFF_AIMS: Final = ["any", "any", "stripped", "metadata"]
_aims = st.sampled_from(HANDOFF_AIMS)
_any_requests = requests()
_stripped_requests = requests(mm=True, grids=False, n=single_samples, kv=False)
_bare_metadata_requests = metadata_requests(kv=False)


@st.composite
def handoffs(draw: st.DrawFn) -> tuple[Request, WorkerCapability, PrefillResult]:
    """A request, its decode worker, and what the prefill returned.

    Half of the examples aim at the post-prefill check: a request without KV whose leg
    is stripped (a grid-less multimodal request, n<=1, on a language-model-only worker)
    or M-RoPE metadata, with a prefill that mostly returned nothing (the 502) and
    otherwise returned the handoff (which must pass). The other half are anything.
    """
    aim = draw(_aims)
    if aim == "stripped":
        return draw(_stripped_requests), draw(lm_only_workers), draw(prefill_nothing_mostly)
    if aim == "metadata":
        return draw(_bare_metadata_requests), draw(metadata_workers), draw(prefill_nothing_mostly)
    return draw(_any_requests), draw(workers), draw(prefill_results)


# --- the interesting cases, named for hypothesis.event and counted by test_strategy_rates ---

GRIDLESS_N_SAMPLES: Final = "case: grid-less multimodal request, n>1"
PLACEHOLDERS_NO_PAYLOAD: Final = "case: placeholders without a payload"
HASHLESS_BATCH: Final = "case: hash-less batch"
PAST_FIRST_CARVE_OUT: Final = "case: language-model-only worker past the first carve-out"
FIRED_502: Final = "case: the 502 fired (stripped leg, no KV after prefill)"
HASHLESS_DROPPED: Final = "case: an empty hash-less batch dropped from a built stripped leg"
UNIDENTIFIED_REFUSED: Final = "case: media without content hashes refused (no identity)"


def request_cases(request: Request) -> list[str]:
    """The interesting cases ``request`` is, by its own facts."""
    cases = []
    if request.batches:
        grids = any(t.name in MROPE_GRID_KEYS for b in request.batches for t in b.tensors)
        if not grids and request.n > 1:
            cases.append(GRIDLESS_N_SAMPLES)
        if any(b.placeholders and not b.carries_payload for b in request.batches):
            cases.append(PLACEHOLDERS_NO_PAYLOAD)
        if any(not b.mm_hashes for b in request.batches):
            cases.append(HASHLESS_BATCH)
    return cases


def decision_cases(request: Request, worker: WorkerCapability) -> list[str]:
    """The interesting cases of deciding ``request`` for ``worker``."""
    cases = request_cases(request)
    if not (worker.language_model_only and request.batches):
        return cases
    try:
        sequential_pd_decode_form(request, worker)
    except MropeOnLanguageModelOnlyDecode:
        return cases  # the first carve-out ended it (or the metadata path's refusal)
    except MissingMediaIdentity:
        cases.append(UNIDENTIFIED_REFUSED)  # after every carve-out
    except PolicyError:
        pass  # a later carve-out: past the first
    else:
        if any(not b.mm_hashes for b in request.batches):
            cases.append(HASHLESS_DROPPED)
    cases.append(PAST_FIRST_CARVE_OUT)
    return cases


def note(cases: list[str]) -> None:
    """Report each case to Hypothesis' statistics."""
    for case in cases:
        event(case)

"""Invariants of the core, proved over generated requests and workers."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from fuzzing import counted, fuzz
from pd_policy import (
    ERROR_CATALOG,
    MROPE_GRID_KEYS,
    SALT_FOLD_PREFIX,
    DecodeForm,
    KvConnectorMode,
    MalformedRequest,
    MediaRefsOnLanguageModelOnlyDecode,
    MissingKvTransferParams,
    MissingMediaIdentity,
    Modality,
    MropeOnLanguageModelOnlyDecode,
    MultimodalBatch,
    NSamplesOnLanguageModelOnlyDecode,
    PolicyError,
    Request,
    VisionSupport,
    WorkerCapability,
    build_decode_leg,
    clone_without_mm,
    ensure_kv_handoff,
    ensure_language_model_only_leg,
    fold_salt,
    has_mrope_grids,
    identity_only,
    relay_kv,
    request_from_json,
    request_to_json,
    sequential_pd_decode_form,
    unidentified_media,
)
from pd_policy.tools.outcome import PrefillResult
from strategies import (
    adversarial_text,
    decision_cases,
    handoffs,
    hashes,
    kv_objects,
    note,
    requests,
    salts,
    workers,
)

LM_ONLY = WorkerCapability(VisionSupport.FALSE)


def flat_hashes(request: Request) -> list[str]:
    return [h for b in request.batches for h in b.mm_hashes]


@fuzz
@given(handoffs())
@counted
def test_the_pipeline_is_total(example: tuple[Request, WorkerCapability, PrefillResult]) -> None:
    # Each step is called here, not through a wrapper that catches: anything but a
    # catalogued policy error escapes and fails the test.
    request, worker, prefill = example
    note(decision_cases(request, worker))
    try:
        form, leg = build_decode_leg(request, worker)
    except PolicyError as exc:
        assert_catalogued(exc, 400)
        return
    assert form is sequential_pd_decode_form(request, worker)
    leg = relay_kv(leg, prefill.kv_transfer_params, prefill.kv_legacy)
    try:
        ensure_kv_handoff(request, form, leg, KvConnectorMode.PASSTHROUGH)
    except PolicyError as exc:
        assert_catalogued(exc, 502)
        return
    if worker.language_model_only:
        # What the policy lets through, the worker's own guard serves.
        ensure_language_model_only_leg(
            leg, uses_mrope=form is DecodeForm.MROPE_METADATA,
            takes_mm_metadata=worker.takes_mm_metadata,
        )  # fmt: skip


def assert_catalogued(exc: PolicyError, status: int) -> None:
    entry = ERROR_CATALOG[exc.code]
    assert type(exc) is entry.error
    assert exc.status == entry.status == status
    assert not exc.retryable
    assert len(str(exc).splitlines()) == 1


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                        st.sampled_from(["request_id", "input_ids", "text", "batches", "n",
                                         "mm_hashes", "placeholders", "offset", "length",
                                         "tensors", "shape", "dtype", "media_refs", "url",
                                         "kv_transfer_params", "cache_salt", "x"]),
                        inner, max_size=5),
                    max_leaves=20))  # fmt: skip
def test_decoding_any_json_gives_a_request_or_a_typed_400(document: object) -> None:
    try:
        request = request_from_json(document)
    except PolicyError as exc:
        assert exc.code == "pd_invalid_request"
        assert exc.status == 400
    else:
        assert request_from_json(request_to_json(request)) == request


@given(requests())
def test_the_codec_round_trips(request: Request) -> None:
    assert request_from_json(json.loads(json.dumps(request_to_json(request)))) == request


@given(requests(), workers)
def test_a_stripped_leg_carries_only_ids_hashes_and_kv(
    request: Request, worker: WorkerCapability
) -> None:
    worker = WorkerCapability(VisionSupport.FALSE, worker.mm_processor)
    try:
        form, leg = build_decode_leg(request, worker)
    except PolicyError:
        return
    assert form is DecodeForm.TEXT_PLUS_HASHES
    assert leg.media_refs == ()
    for batch in leg.batches:
        assert batch.pixel_values is None
        assert batch.tensors == ()
        assert batch.placeholders == ()
        assert batch.mm_hashes
        assert batch.is_hash_identity


@given(requests(), workers)
def test_every_leg_keeps_ids_request_id_kv_and_salt_verbatim(
    request: Request, worker: WorkerCapability
) -> None:
    try:
        _, leg = build_decode_leg(request, worker)
    except PolicyError:
        return
    assert leg.request_id == request.request_id
    assert leg.input_ids == request.input_ids
    assert leg.text == request.text
    assert leg.kv_transfer_params == request.kv_transfer_params
    assert leg.kv_legacy == request.kv_legacy
    assert leg.cache_salt == request.cache_salt
    assert leg.n == request.n


@given(requests())
def test_clone_without_mm_is_idempotent_and_keeps_hash_order(request: Request) -> None:
    once = clone_without_mm(request)
    assert clone_without_mm(once) == once
    assert flat_hashes(once) == flat_hashes(request)
    # Modality travels with each batch's hashes, in wire order.
    expected = [(b.modality, b.mm_hashes) for b in request.batches if b.mm_hashes]
    assert [(b.modality, b.mm_hashes) for b in once.batches] == expected


@given(requests())
def test_a_stripped_leg_equals_one_the_validating_constructors_make(request: Request) -> None:
    # clone_without_mm skips the constructors' checks (its input passed them): the leg
    # it makes must be the one they would make, field for field.
    checked = tuple(
        MultimodalBatch(modality=b.modality, mm_hashes=b.mm_hashes)
        for b in request.batches
        if b.mm_hashes
    )
    leg = clone_without_mm(request)
    assert leg == request.derive(batches=checked, media_refs=())
    assert all(b.is_hash_identity for b in leg.batches)


@given(requests())
def test_identity_only_keeps_identity_and_only_inline_grids(request: Request) -> None:
    leg = identity_only(request)
    assert leg.media_refs == request.media_refs
    assert flat_hashes(leg) == flat_hashes(request)
    originals = iter(b for b in request.batches if b.mm_hashes)
    for batch in leg.batches:
        source = next(originals)
        assert batch.pixel_values is None
        assert batch.placeholders == source.placeholders
        assert batch.im_token_id == source.im_token_id
        flat = dict(batch.flat_keys)
        for tensor in batch.tensors:
            assert tensor.is_inline
            assert tensor in source.tensors
            assert tensor.name in MROPE_GRID_KEYS or tensor.name in flat.values()
        kept = set(batch.tensor_names)
        assert set(batch.batched_keys) <= kept
        assert set(batch.keep_on_cpu_keys) <= kept
        assert {g for g in kept if g in MROPE_GRID_KEYS} <= set(batch.keep_on_cpu_keys)
    assert identity_only(leg) == leg


@given(requests())
def test_carve_outs_fire_in_the_contracts_order(request: Request) -> None:
    if has_mrope_grids(request):
        expected: type[PolicyError] | None = MropeOnLanguageModelOnlyDecode
    elif request.media_refs:
        expected = MediaRefsOnLanguageModelOnlyDecode
    elif request.n > 1 and request.batches:
        expected = NSamplesOnLanguageModelOnlyDecode
    elif unidentified_media(request) is not None:
        expected = MissingMediaIdentity  # after every carve-out
    else:
        expected = None
    try:
        form = sequential_pd_decode_form(request, LM_ONLY)
    except PolicyError as exc:
        assert type(exc) is expected
    else:
        assert expected is None
        assert form is DecodeForm.TEXT_PLUS_HASHES


@given(requests(), st.sampled_from([VisionSupport.TRUE, VisionSupport.UNKNOWN]))
def test_a_vision_capable_worker_never_gets_a_carve_out(
    request: Request, support: VisionSupport
) -> None:
    unnamed = any(
        not b.mm_hashes and (b.carries_payload or b.placeholders) for b in request.batches
    )
    if request.n <= 1 and unnamed:
        # Not a carve-out: no worker can take the KV for media it cannot tell apart.
        with pytest.raises(MissingMediaIdentity):
            sequential_pd_decode_form(request, WorkerCapability(support))
        return
    form = sequential_pd_decode_form(request, WorkerCapability(support))
    assert form is (DecodeForm.IDENTITY_ONLY if request.n <= 1 else DecodeForm.FULL)


identities = st.lists(st.tuples(st.sampled_from(list(Modality)), hashes), max_size=6)


@given(identities, salts)
def test_the_salt_fold_is_deterministic_and_bounded(
    items: list[tuple[Modality, str]], salt: str | None
) -> None:
    folded = fold_salt(items, salt)
    assert folded == fold_salt(list(items), salt)
    if not items:
        assert folded == salt
    else:
        assert folded is not None
        assert folded.startswith(SALT_FOLD_PREFIX)
        assert len(folded) == len(SALT_FOLD_PREFIX) + 64


@given(identities, salts, identities, salts)
def test_the_salt_fold_is_injective(
    a: list[tuple[Modality, str]], sa: str | None, b: list[tuple[Modality, str]], sb: str | None
) -> None:
    assume(a and b and (a, sa) != (b, sb))
    assert fold_salt(a, sa) != fold_salt(b, sb)


#: The letters an unprefixed encoding would put between items: the fold's own modality tags.
TAGS = {Modality.IMAGE: "I", Modality.AUDIO: "A", Modality.VIDEO: "V"}


@given(st.sampled_from(list(Modality)), hashes, st.text(max_size=6), hashes, salts)
def test_the_salt_fold_resists_a_boundary_forged_with_its_own_tag(
    modality: Modality, a: str, b: str, c: str, salt: str | None
) -> None:
    # Were items written as tag + text with no length, "a<T>b", "c" and "a", "b<T>c" would
    # both read "<T>a<T>b<T>c": two items each, the same bytes.
    tag = TAGS[modality]
    left = [(modality, a + tag + b), (modality, c)]
    right = [(modality, a), (modality, b + tag + c)]
    assert fold_salt(left, salt) != fold_salt(right, salt)


@given(st.lists(hashes, min_size=1, max_size=4), adversarial_text)
def test_the_salt_fold_resists_splits_joins_and_reorders(parts: list[str], salt: str) -> None:
    image = [(Modality.IMAGE, h) for h in parts]
    folds = {fold_salt(image, salt)}
    joined = [(Modality.IMAGE, ",".join(parts))]
    moved = [(Modality.IMAGE, h) for h in parts[:-1]]
    variants = [
        (joined, salt),  # "a,b" against "a","b"
        ([(Modality.VIDEO, h) for h in parts], salt),  # modality counts
        (image, None),  # a caller's salt is never dropped
        (image, salt + "x"),
        (moved, salt + "," + parts[-1]) if moved else (image, salt + "\x00"),  # no shifting
        *(
            ([(m, h) for m, h in p], salt)
            for p in itertools.permutations(image)
            if list(p) != image
        ),
    ]
    seen: set[tuple[tuple[tuple[Modality, str], ...], str | None]] = {(tuple(image), salt)}
    for items, s in variants:
        if (tuple(items), s) in seen:  # repeated parts permute into the same input
            continue
        seen.add((tuple(items), s))
        folded = fold_salt(items, s)
        assert folded not in folds
        folds.add(folded)


@given(handoffs())
def test_the_502_fires_exactly_when_a_leg_that_needs_kv_has_none(
    example: tuple[Request, WorkerCapability, PrefillResult],
) -> None:
    request, worker, prefill = example
    try:
        form, leg = build_decode_leg(request, worker)
    except PolicyError:
        return
    leg = relay_kv(leg, prefill.kv_transfer_params, prefill.kv_legacy)
    # Passthrough: a handoff is any field with a value, or a legacy pair with host and port.
    params = leg.kv_transfer_params_dict() or {}
    legacy = leg.kv_legacy
    has_kv = any(
        value not in (None, "", [], {}) and (key != "do_remote_prefill" or value is True)
        for key, value in params.items()
    ) or (legacy is not None and bool(legacy.remote_host) and legacy.remote_port > 0)
    # A stripped leg recomputes an image-blind prompt; a metadata leg would need an encoder.
    needs_kv = (form is DecodeForm.TEXT_PLUS_HASHES and bool(request.batches)) or (
        form is DecodeForm.MROPE_METADATA
    )
    try:
        ensure_kv_handoff(request, form, leg, KvConnectorMode.PASSTHROUGH)
    except MissingKvTransferParams as exc:
        assert needs_kv and not has_kv
        assert exc.status == 502
        assert not exc.retryable
    else:
        assert not (needs_kv and not has_kv)


@given(requests(), kv_objects)
def test_kv_is_relayed_only_for_a_single_sample(
    request: Request, returned: dict[str, object]
) -> None:
    leg = relay_kv(request, returned)
    if request.n <= 1:
        assert leg.kv_transfer_params_dict() == returned
        # relay_kv sets the one field without the constructor: as the constructor would.
        assert leg == request.derive(kv_transfer_params=returned)
    else:
        assert leg == request


@given(requests(), st.sampled_from(["[1]", "not json", '{"a":1,"a":2}', 7, ["x"]]))
def test_kv_that_is_not_a_json_object_is_refused_when_relayed(
    request: Request, returned: object
) -> None:
    assume(request.n <= 1)
    with pytest.raises(MalformedRequest) as caught:
        relay_kv(request, returned)  # type: ignore[arg-type]
    assert caught.value.param == "kv_transfer_params"


@given(requests(), workers)
def test_a_built_stripped_leg_always_passes_the_worker_guard(
    request: Request, worker: WorkerCapability
) -> None:
    try:
        form, leg = build_decode_leg(request, WorkerCapability(VisionSupport.FALSE))
    except PolicyError:
        return
    assert form is DecodeForm.TEXT_PLUS_HASHES
    ensure_language_model_only_leg(leg)


@given(requests(mm=True))
def test_the_worker_guard_refuses_any_payload_or_placeholder(request: Request) -> None:
    unservable = any(b.carries_payload or b.placeholders for b in request.batches)
    try:
        ensure_language_model_only_leg(request)
    except PolicyError as exc:
        assert exc.status == 400
    else:
        assert not unservable


@given(requests(mm=True))
def test_an_mrope_worker_refuses_any_leg_that_still_names_media(request: Request) -> None:
    leg = clone_without_mm(request)
    try:
        ensure_language_model_only_leg(leg, uses_mrope=True)
    except MropeOnLanguageModelOnlyDecode:
        assert leg.batches  # refused exactly when media identities remain
    else:
        assert not leg.batches

"""Choosing decode workers before dispatch; refusing media no worker can take."""

from __future__ import annotations

import contextlib
from unittest import mock

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pd_policy.decision
import pd_policy.selection
from pd_policy import (
    DecodeCandidate,
    DecodeForm,
    MropeOnLanguageModelOnlyDecode,
    MultimodalNotSupported,
    NoDecodeWorkerAvailable,
    PolicyError,
    Request,
    VisionSupport,
    WorkerCapability,
    ensure_model_accepts_media,
    select_decode_workers,
    sequential_pd_decode_form,
)
from pd_policy.decode_kv import DecodeKv, KvLoad, LoadFailure
from pd_policy.tools.scenarios import (
    image_request,
    media_ref_request,
    mrope_request,
    text_request,
)
from pd_policy.wire_errors import MediaOnBlindDecode
from strategies import requests, workers

candidate_lists = st.lists(
    st.builds(DecodeCandidate, workers, st.integers()), min_size=1, max_size=12
)


def serves(request: Request, worker: WorkerCapability) -> bool:
    try:
        sequential_pd_decode_form(request, worker)
    except PolicyError:
        return False
    return True


@given(requests(), candidate_lists)
def test_selection_returns_exactly_the_servable_workers_in_order(
    request: Request, candidates: list[DecodeCandidate[int]]
) -> None:
    expected = [c for c in candidates if serves(request, c.worker)]
    try:
        chosen = select_decode_workers(request, candidates)
    except PolicyError as exc:
        assert expected == []
        # The error explains why: the carve-out every candidate hit.
        with pytest.raises(type(exc)):
            sequential_pd_decode_form(request, candidates[0].worker)
    else:
        assert chosen == expected
        assert chosen  # never an empty answer: that case raises


class CountingWorker:
    """A capability stand-in that counts how often the selection reads it."""

    def __init__(self, language_model_only: bool, takes_mm_metadata: bool, blind: bool) -> None:
        self._lm_only = language_model_only
        self._metadata = takes_mm_metadata
        self._blind = blind
        self.reads = 0

    @property
    def language_model_only(self) -> bool:
        self.reads += 1
        return self._lm_only

    @property
    def takes_mm_metadata(self) -> bool:
        self.reads += 1
        return self._metadata

    @property
    def blind_to_stripped_media(self) -> bool:
        self.reads += 1
        return self._blind


@given(
    st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans()), min_size=1, max_size=50),
    requests(),
)
def test_selection_is_linear_with_a_decision_per_kind(
    flags: list[tuple[bool, bool, bool]], request: Request
) -> None:
    stand_ins = [CountingWorker(*f) for f in flags]
    candidates = [DecodeCandidate(w, i) for i, w in enumerate(stand_ins)]  # type: ignore[arg-type]
    real = pd_policy.decision.decide_decode_form
    with (
        mock.patch.object(pd_policy.selection, "decide_decode_form", wraps=real) as decide,
        contextlib.suppress(PolicyError),
    ):
        select_decode_workers(request, candidates)
    # One decision per kind of worker: vision, language-model-only with and without
    # metadata, blind to a stripped leg or not.
    assert decide.call_count <= len(set(flags))
    # Each worker is read once: its kind.
    assert all(w.reads == 3 for w in stand_ins)


def test_a_capable_worker_is_preferred_over_a_refusal() -> None:
    lm_only = DecodeCandidate(WorkerCapability(VisionSupport.FALSE), "lm")
    vision = DecodeCandidate(WorkerCapability(VisionSupport.TRUE), "vision")
    assert select_decode_workers(mrope_request(), [lm_only, vision]) == [vision]
    assert select_decode_workers(image_request(), [lm_only, vision]) == [lm_only, vision]
    with pytest.raises(MropeOnLanguageModelOnlyDecode):
        select_decode_workers(mrope_request(), [lm_only, lm_only])
    with pytest.raises(NoDecodeWorkerAvailable):
        select_decode_workers(text_request(), [])


LM, VIS, UNK = (
    WorkerCapability(s) for s in (VisionSupport.FALSE, VisionSupport.TRUE, VisionSupport.UNKNOWN)
)


@pytest.mark.parametrize(
    ("pool", "refused"),
    [
        ([LM, LM], True),
        ([LM], True),
        ([], False),
        ([LM, VIS], False),
        ([LM, UNK], False),
        ([UNK], False),
    ],
)
def test_ensure_model_accepts_media(pool: list[WorkerCapability], refused: bool) -> None:
    if refused:
        with pytest.raises(MultimodalNotSupported) as exc:
            ensure_model_accepts_media(image_request(), pool, model="tiny-llava")
        assert exc.value.status == 400
        assert "'tiny-llava'" in exc.value.message
    else:
        ensure_model_accepts_media(image_request(), pool)
    ensure_model_accepts_media(text_request(), pool)  # text always passes


@pytest.mark.parametrize("pool", [[LM], [LM, LM]])
def test_media_references_are_media_too(pool: list[WorkerCapability]) -> None:
    # The worker would fetch and encode them: a pool with no encoder cannot take them.
    with pytest.raises(MultimodalNotSupported):
        ensure_model_accepts_media(media_ref_request(), pool)
    ensure_model_accepts_media(media_ref_request(), [*pool, VIS])


# --- a decode blind to a stripped leg ---------------------------------------------------

pools = st.lists(workers, min_size=1, max_size=8)


def _outcome(request: Request, pool: list[WorkerCapability]) -> list[int] | str:
    try:
        chosen = select_decode_workers(request, [DecodeCandidate(w, i) for i, w in enumerate(pool)])
    except PolicyError as exc:
        return exc.code
    return [c.handle for c in chosen]


def _sighted(worker: WorkerCapability) -> WorkerCapability:
    return attrs.evolve(worker, decode_kv=DecodeKv())


def _strips_media(request: Request, worker: WorkerCapability) -> bool:
    form = sequential_pd_decode_form(request, _sighted(worker))
    return form is DecodeForm.MROPE_METADATA or (
        form is DecodeForm.TEXT_PLUS_HASHES and request.has_mm_inputs
    )


@given(requests(), pools)
def test_no_stripped_media_leg_is_ever_selected_for_a_blind_decode(
    request: Request, pool: list[WorkerCapability]
) -> None:
    chosen = _outcome(request, pool)
    if isinstance(chosen, str):
        return
    for i in chosen:
        assert not (pool[i].blind_to_stripped_media and _strips_media(request, pool[i]))


@given(requests(mm=False), pools)
def test_blindness_changes_nothing_for_text(request: Request, pool: list[WorkerCapability]) -> None:
    assert _outcome(request, pool) == _outcome(request, [_sighted(w) for w in pool])


@given(requests(mm=True, n=st.just(1)), pools)
def test_a_blind_decode_is_passed_over_for_another_that_fits(
    request: Request, pool: list[WorkerCapability]
) -> None:
    fits = [i for i, w in enumerate(pool) if serves(request, _sighted(w))]
    expected = [i for i in fits if not (pool[i].blind_to_stripped_media
                                        and _strips_media(request, pool[i]))]  # fmt: skip
    chosen = _outcome(request, pool)
    if expected:
        assert chosen == expected
    else:
        assert isinstance(chosen, str)
        if fits and fits == list(range(len(pool))):  # each one refused only for blindness
            assert chosen == MediaOnBlindDecode.code


def test_the_blind_decodes_by_name() -> None:
    lm_only = WorkerCapability(VisionSupport.FALSE)
    content = attrs.evolve(lm_only, decode_kv=DecodeKv(KvLoad.BY_CONTENT))
    recompute = attrs.evolve(lm_only, decode_kv=DecodeKv(KvLoad.BY_REQUEST, LoadFailure.RECOMPUTE))
    nothing = attrs.evolve(lm_only, decode_kv=DecodeKv(KvLoad.NONE))
    assert _outcome(image_request(), [content, recompute, nothing, lm_only]) == [3]
    assert _outcome(image_request(), [content, nothing]) == MediaOnBlindDecode.code
    assert _outcome(text_request(), [content, recompute, nothing]) == [0, 1, 2]
    metadata = WorkerCapability(VisionSupport.FALSE, accepts_mm_metadata=VisionSupport.TRUE)
    blind_metadata = attrs.evolve(metadata, decode_kv=DecodeKv(on_failure=LoadFailure.RECOMPUTE))
    assert _outcome(mrope_request(), [blind_metadata, metadata]) == [1]
    assert _outcome(mrope_request(), [blind_metadata]) == MediaOnBlindDecode.code
    # A vision decode gets the media itself, whatever its connector.
    vision = WorkerCapability(VisionSupport.TRUE, decode_kv=DecodeKv(KvLoad.BY_CONTENT))
    assert _outcome(image_request(), [vision]) == [0]

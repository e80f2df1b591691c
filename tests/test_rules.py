"""Every rule of the decision over every combination of the facts it reads.

The golden vectors pin examples, and regenerating them would pin whatever the code
then does; these tests state each rule once more, independently of the code's own
structure, and check every combination.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given

from pd_policy import (
    DecodeForm,
    MediaRefsOnLanguageModelOnlyDecode,
    MissingMediaIdentity,
    MropeOnLanguageModelOnlyDecode,
    NSamplesOnLanguageModelOnlyDecode,
    PolicyError,
    Request,
    WorkerCapability,
    decide_decode_form,
    has_mrope_grids,
    mrope_metadata_gap,
    sequential_pd_decode_form,
    unidentified_media,
)
from pd_policy.wire_errors import MediaOnBlindDecode
from strategies import decision_cases, note, requests, workers

Expected = DecodeForm | type[PolicyError]
GAP = MropeOnLanguageModelOnlyDecode("an M-RoPE grid without its hashes")
#: n as the wire sends it: 0 (unset), one sample, several, the uint32 bound.
NS = (0, 1, 2, 2**32 - 1)


def contract(
    *, lm_only: bool, n: int, grids: bool, refs: bool, mm: bool, metadata: bool, gap: bool,
    unidentified: bool, blind: bool,
) -> Expected:  # fmt: skip
    """The contract, read as a flat list of rules: the first that applies decides."""
    several = n > 1
    rules: list[tuple[bool, Expected]] = [
        # A leg that takes the prefill's KV for media it cannot name would share the decode
        # worker's cache across different media.
        (not lm_only and not several and unidentified, MissingMediaIdentity),
        (not lm_only and not several, DecodeForm.IDENTITY_ONLY),
        (not lm_only, DecodeForm.FULL),  # decode recomputes: no handoff for n>1
        (grids and not metadata, MropeOnLanguageModelOnlyDecode),  # 1st carve-out
        (refs, MediaRefsOnLanguageModelOnlyDecode),  # 2nd
        (several and (mm or grids), NSamplesOnLanguageModelOnlyDecode),  # 3rd
        (grids and gap, MropeOnLanguageModelOnlyDecode),  # metadata incomplete: says what
        # A decode that could answer a stripped leg image-blind never gets one.
        (grids and blind, MediaOnBlindDecode),
        (grids, DecodeForm.MROPE_METADATA),
        (unidentified, MissingMediaIdentity),
        (blind and mm, MediaOnBlindDecode),
    ]
    return next((outcome for applies, outcome in rules if applies), DecodeForm.TEXT_PLUS_HASHES)


def decided(**facts: bool | int) -> Expected:
    gap = facts.pop("gap")
    try:
        return decide_decode_form(
            language_model_only=bool(facts["lm_only"]), n=int(facts["n"]),
            has_mrope_grids=bool(facts["grids"]), has_media_refs=bool(facts["refs"]),
            has_mm_inputs=bool(facts["mm"]), takes_mm_metadata=bool(facts["metadata"]),
            metadata_gap=GAP if gap else None,
            unidentified="batches[0].mm_hashes" if facts["unidentified"] else None,
            blind_to_stripped_media=bool(facts["blind"]),
        )  # fmt: skip
    except PolicyError as exc:
        assert exc.status == 400 and not exc.retryable
        if gap and facts["metadata"] and isinstance(exc, MropeOnLanguageModelOnlyDecode):
            assert exc is GAP  # the gap's own message, not a generic one
        return type(exc)


NAMES = ("lm_only", "grids", "refs", "mm", "metadata", "gap", "unidentified", "blind")
COMBINATIONS = [
    dict(zip(NAMES, flags, strict=True), n=n)
    for flags in itertools.product((False, True), repeat=len(NAMES))
    for n in NS
]


@pytest.mark.parametrize(
    "facts", COMBINATIONS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items())
)
def test_every_combination_of_facts_is_decided_by_the_contract(facts: dict[str, int]) -> None:
    assert decided(**facts) == contract(**facts)  # type: ignore[arg-type]


def test_every_outcome_is_reached_by_some_combination() -> None:
    # A rule no combination reaches is a rule this table does not test.
    outcomes = {contract(**facts) for facts in COMBINATIONS}  # type: ignore[arg-type]
    assert outcomes == {
        *DecodeForm,
        MropeOnLanguageModelOnlyDecode,
        MediaRefsOnLanguageModelOnlyDecode,
        NSamplesOnLanguageModelOnlyDecode,
        MissingMediaIdentity,
        MediaOnBlindDecode,
    }


@given(requests(), workers)
def test_a_request_is_decided_by_the_contract_over_its_own_facts(
    request: Request, worker: WorkerCapability
) -> None:
    note(decision_cases(request, worker))
    grids = has_mrope_grids(request)
    metadata = worker.takes_mm_metadata
    expected = contract(
        lm_only=worker.language_model_only, n=request.n, grids=grids,
        refs=bool(request.media_refs), mm=bool(request.batches), metadata=metadata,
        gap=metadata and grids and mrope_metadata_gap(request) is not None,
        unidentified=unidentified_media(request) is not None,
        blind=worker.blind_to_stripped_media,
    )  # fmt: skip
    try:
        assert sequential_pd_decode_form(request, worker) is expected
    except PolicyError as exc:
        assert type(exc) is expected

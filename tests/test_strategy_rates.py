"""The strategies reach what the properties claim to prove: measured, not assumed.

A property over generated input proves nothing about a case its strategy almost
never draws. Each test here draws a fixed number of examples (derandomized, so the
count is reproducible) through the strategy the properties use, counts the cases
:mod:`strategies` names, and asserts that each is at least a tenth of the examples
that can reach it (its denominator: a text request cannot be a grid-less image).

The rates move with the modules loaded (Hypothesis mixes constants it finds in them into
what it draws): alone and inside the whole suite they differ by up to half, so every
case is weighted to clear the bound by a margin, measured in both settings.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final, TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from pd_policy import (
    MROPE_GRID_KEYS,
    DecodeForm,
    KvConnectorMode,
    MissingKvTransferParams,
    PolicyError,
    Request,
    WorkerCapability,
    build_decode_leg,
    ensure_kv_handoff,
    relay_kv,
)
from pd_policy.tools.outcome import PrefillResult
from strategies import (
    FIRED_502,
    GRIDLESS_N_SAMPLES,
    HASHLESS_BATCH,
    HASHLESS_DROPPED,
    PAST_FIRST_CARVE_OUT,
    PLACEHOLDERS_NO_PAYLOAD,
    UNIDENTIFIED_REFUSED,
    decision_cases,
    handoffs,
    request_cases,
    requests,
    workers,
)

# The wire strategies live beside the gRPC tests, a directory pytest puts on sys.path only
# once it collects a test there: this file must run alone too.
sys.path.insert(0, str(Path(__file__).parent / "grpc"))
from proto_strategies import EXTRAS_ONLY, EXTRAS_ONLY_GRID, ON_THE_WIRE_MM, proto_cases, protos

#: Examples drawn per strategy: a rate of 10% is then known to about +-1%.
EXAMPLES: Final = 1000
MIN_RATE: Final = 0.10

T = TypeVar("T")

# Denominators: the examples that can reach a case.
MULTIMODAL: Final = "reach: multimodal batches"
#: A batch with a grid tensor carries a payload: only a grid-less batch can be placeholders
#: alone.
TOKENIZED_GRIDLESS: Final = "reach: a grid-less batch on tokenized input"
LM_ONLY_MULTIMODAL: Final = "reach: multimodal batches on a language-model-only worker"
STRIPPED_BUILT: Final = "reach: a stripped leg built from multimodal batches"
HANDOFF_CHECKED: Final = "reach: the post-prefill check"
#: Only a request that no carve-out refuses can reach the refusal of unnamed media.
PAST_CARVE_OUTS: Final = "reach: a grid-less, reference-less, single-sample multimodal request"
ALL: Final = "examples"


def measure(strategy: st.SearchStrategy[T], classify: Callable[[T], Iterable[str]]) -> Counter[str]:
    """Draw ``EXAMPLES`` examples of ``strategy`` and count the labels ``classify`` gives."""
    counts: Counter[str] = Counter()

    # Generation only: with nothing to fail, shrinking never runs, and no database entry
    # or earlier run changes what is drawn.
    @settings(
        max_examples=EXAMPLES,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(strategy)
    def draw(example: T) -> None:
        counts[ALL] += 1
        counts.update(classify(example))

    draw()
    return counts


def rate(counts: Counter[str], case: str, reach: str) -> float:
    assert counts[reach] > 0, f"nothing reached {reach!r}"
    return counts[case] / counts[reach]


def check(counts: Counter[str], expected: list[tuple[str, str]]) -> None:
    report = {case: f"{rate(counts, case, reach):.1%} of {reach}" for case, reach in expected}
    print(report)  # shown with -s: the measured rates
    for case, reach in expected:
        assert rate(counts, case, reach) >= MIN_RATE, report


def request_labels(request: Request) -> list[str]:
    labels = request_cases(request)
    if request.batches:
        labels.append(MULTIMODAL)
        if request.input_ids is not None and any(
            not (MROPE_GRID_KEYS & set(b.tensor_names)) for b in request.batches
        ):
            labels.append(TOKENIZED_GRIDLESS)
    return labels


def test_requests_reach_every_shape_of_batch() -> None:
    counts = measure(requests(), request_labels)
    check(
        counts,
        [
            (GRIDLESS_N_SAMPLES, MULTIMODAL),
            (PLACEHOLDERS_NO_PAYLOAD, TOKENIZED_GRIDLESS),
            (HASHLESS_BATCH, MULTIMODAL),
            (MULTIMODAL, ALL),
        ],
    )


def decision_labels(example: tuple[Request, WorkerCapability]) -> list[str]:
    request, worker = example
    labels = decision_cases(request, worker)
    if worker.language_model_only and request.batches:
        labels.append(LM_ONLY_MULTIMODAL)
        grids = any(MROPE_GRID_KEYS & set(b.tensor_names) for b in request.batches)
        if not grids and not request.media_refs and request.n <= 1:
            labels.append(PAST_CARVE_OUTS)
        try:
            form, _ = build_decode_leg(request, worker)
        except PolicyError:
            return labels
        if form is DecodeForm.TEXT_PLUS_HASHES:
            labels.append(STRIPPED_BUILT)
    return labels


def test_language_model_only_workers_get_past_the_first_carve_out() -> None:
    counts = measure(st.tuples(requests(), workers), decision_labels)
    check(
        counts,
        [
            (PAST_FIRST_CARVE_OUT, LM_ONLY_MULTIMODAL),
            (HASHLESS_DROPPED, STRIPPED_BUILT),
            (UNIDENTIFIED_REFUSED, PAST_CARVE_OUTS),
        ],
    )


def handoff_labels(example: tuple[Request, WorkerCapability, PrefillResult]) -> list[str]:
    request, worker, prefill = example
    labels = decision_cases(request, worker)
    if worker.language_model_only and request.batches:
        labels.append(LM_ONLY_MULTIMODAL)
    try:
        form, leg = build_decode_leg(request, worker)
    except PolicyError:
        return labels
    labels.append(HANDOFF_CHECKED)
    leg = relay_kv(leg, prefill.kv_transfer_params, prefill.kv_legacy)
    try:
        ensure_kv_handoff(request, form, leg, KvConnectorMode.PASSTHROUGH)
    except MissingKvTransferParams:
        labels.append(FIRED_502)
    return labels


def test_the_handoff_strategy_fires_the_502() -> None:
    counts = measure(handoffs(), handoff_labels)
    check(
        counts,
        [
            (FIRED_502, ALL),
            (FIRED_502, HANDOFF_CHECKED),
            (PAST_FIRST_CARVE_OUT, LM_ONLY_MULTIMODAL),
        ],
    )


def test_wire_messages_carry_extras_without_a_primary() -> None:
    counts = measure(protos(), proto_cases)
    check(counts, [(EXTRAS_ONLY, ON_THE_WIRE_MM), (EXTRAS_ONLY_GRID, EXTRAS_ONLY)])

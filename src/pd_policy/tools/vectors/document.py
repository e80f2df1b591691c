"""The vectors document: build it, write it canonically, run it, compare results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from pd_policy.salt import SALT_FOLD_VERSION

from .cases import all_cases
from .operations import run_case

__all__ = [
    "FORMAT",
    "VECTORS_VERSION",
    "Mismatch",
    "build_vectors",
    "compare_results",
    "dumps",
    "run_vectors",
]

#: Name of the document format.
FORMAT: Final = "pd-policy-conformance-vectors"
#: Version of the document format; a change of meaning bumps it.
VECTORS_VERSION: Final = 2


def build_vectors() -> dict[str, Any]:
    """The whole document: format, versions, and every case with its expected outcome."""
    from pd_policy import __version__

    cases = all_cases()
    for case in cases:
        case["expected"] = run_case(case)
    return {
        "format": FORMAT,
        "version": VECTORS_VERSION,
        "pd_policy_version": __version__,
        "salt_fold_version": SALT_FOLD_VERSION,
        "cases": cases,
    }


def dumps(document: Mapping[str, Any]) -> str:
    """The canonical text of a vectors or results document: the same data, the same bytes."""
    return json.dumps(document, indent=1, sort_keys=True, ensure_ascii=True) + "\n"


def run_vectors(document: Mapping[str, Any]) -> dict[str, Any]:
    """This implementation's results for a vectors document, in the results format."""
    return {
        "format": f"{FORMAT}-results",
        "version": VECTORS_VERSION,
        "results": [{"id": c["id"], "outcome": run_case(c)} for c in document["cases"]],
    }


@attrs.frozen(slots=True)
class Mismatch:
    """A case whose outcome differs: its id and what differs."""

    case_id: str
    detail: str

    def __str__(self) -> str:
        return f"{self.case_id}: {self.detail}"


def compare_results(vectors: Mapping[str, Any], results: Mapping[str, Any]) -> list[Mismatch]:
    """Every case whose outcome in ``results`` differs from the expected one, or is missing.

    Only the outcome's data counts (status, form, leg, salts, error code and
    param); error messages are free to differ.
    """
    theirs = {r["id"]: r["outcome"] for r in results.get("results", [])}
    mismatches = []
    for case in vectors["cases"]:
        case_id = case["id"]
        if case_id not in theirs:
            mismatches.append(Mismatch(case_id, "no result"))
            continue
        expected, actual = case["expected"], theirs[case_id]
        for key in sorted(set(expected) | set(actual)):
            if expected.get(key) != actual.get(key):
                mismatches.append(
                    Mismatch(
                        case_id, f"{key}: expected {expected.get(key)!r}, got {actual.get(key)!r}"
                    )
                )
    known = {c["id"] for c in vectors["cases"]}
    mismatches += [Mismatch(i, "not a case of these vectors") for i in theirs if i not in known]
    return mismatches

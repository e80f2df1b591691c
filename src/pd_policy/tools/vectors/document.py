"""The vectors document: build it, write it canonically, run it, compare results."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

import attrs

from pd_policy.errors import MalformedRequest
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
VECTORS_VERSION: Final = 8


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


def _items(document: object, key: str, what: str) -> list[Mapping[str, Any]]:
    """``document[key]``: a list of objects, each with a string ``id``."""
    if not isinstance(document, Mapping):
        raise MalformedRequest(f"a {what} document must be a JSON object", param=None)
    items = document.get(key)
    if not isinstance(items, list):
        raise MalformedRequest(f"a {what} document needs a list of {key}", param=key)
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise MalformedRequest(f"each of {key} must be an object", param=f"{key}[{i}]")
        if not isinstance(item.get("id"), str):
            raise MalformedRequest("needs a string id", param=f"{key}[{i}].id")
    return items


def run_vectors(document: object) -> dict[str, Any]:
    """This implementation's results for a vectors document, in the results format.

    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] whose ``param`` names the
    case and field for a document of the wrong shape (see
    [`run_case`][pd_policy.tools.vectors.operations.run_case]).
    """
    results = []
    for i, case in enumerate(_items(document, "cases", "vectors")):
        try:
            outcome = run_case(case)
        except MalformedRequest as exc:
            where = f"cases[{i}]" + (f".{exc.param}" if exc.param else "")
            raise MalformedRequest(f"case {case['id']!r}: {exc.message}", where) from None
        results.append({"id": case["id"], "outcome": outcome})
    return {"format": f"{FORMAT}-results", "version": VECTORS_VERSION, "results": results}


@attrs.frozen(slots=True)
class Mismatch:
    """A case whose outcome differs: its id and what differs."""

    case_id: str
    detail: str

    def __str__(self) -> str:
        return f"{self.case_id}: {self.detail}"


def compare_results(vectors: object, results: object) -> list[Mismatch]:
    """Every case whose outcome in ``results`` differs from the expected one, or is missing.

    Only the outcome's data counts (status, form, leg, salts, error code and
    param); error messages are free to differ. Raises
    [`MalformedRequest`][pd_policy.errors.MalformedRequest] naming the field for documents of
    the wrong shape (a case without ``expected``, a result without ``outcome``).
    """
    cases = _items(vectors, "cases", "vectors")
    theirs: dict[str, Mapping[str, Any]] = {}
    for i, result in enumerate(_items(results, "results", "results")):
        if not isinstance(result.get("outcome"), Mapping):
            raise MalformedRequest("needs an outcome object", param=f"results[{i}].outcome")
        theirs[result["id"]] = result["outcome"]
    mismatches = []
    for i, case in enumerate(cases):
        case_id = case["id"]
        if not isinstance(case.get("expected"), Mapping):
            raise MalformedRequest("needs an expected outcome", param=f"cases[{i}].expected")
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
    known = {c["id"] for c in cases}
    mismatches += [Mismatch(i, "not a case of these vectors") for i in theirs if i not in known]
    return mismatches

"""The conformance cases of fleet selection: routable first, affinity bounded by load, least
outstanding, two choices, and the 503 of every leg's kind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["fleet_cases"]


def fleet_cases(add: Callable[..., None]) -> None:
    """Append the cases, through ``add(case_id, description, operation, **fields)``."""

    def workers(*loads: int, down: tuple[int, ...] = ()) -> list[dict[str, Any]]:
        return [
            {"name": f"w{i}", "routable": i not in down, "outstanding": n}
            for i, n in enumerate(loads)
        ]

    cases: dict[str, tuple[str, dict[str, Any]]] = {
        "least_outstanding": ("the least loaded", {"workers": workers(3, 1, 2)}),
        "tie_keeps_order": ("a tie goes to the caller's order", {"workers": workers(1, 0, 0)}),
        "skips_the_ejected": (
            "an ejected worker is never chosen",
            {"workers": workers(5, 0, 2, down=(1,))},
        ),
        "affinity_idle": (
            "an idle fleet: the key's first worker",
            {"workers": workers(0, 0, 0, 0), "affinity": "image-a"},
        ),
        "affinity_other_key": (
            "another key, maybe another worker",
            {"workers": workers(0, 0, 0, 0), "affinity": "image-b"},
        ),
        "affinity_over_bound": (
            "the key's worker too loaded: the next in its order",
            {"workers": workers(9, 0, 0, 0), "affinity": "image-a", "bound": 1.0},
        ),
        "affinity_bound_two": (
            "a looser bound keeps the key's worker",
            {"workers": workers(6, 2, 2, 2), "affinity": "image-a", "bound": 2.0},
        ),
        "two_choices": (
            "the less loaded of the two drawn",
            {"workers": workers(4, 1, 3), "balance": "two_choices", "draws": [0, 2]},
        ),
        "bound_below_one": ("a bound below 1 is refused", {"workers": workers(0), "bound": 0.5}),
    }
    for name, (description, fields) in cases.items():
        add(f"choose_worker/{name}", description, "choose_worker", role="prefill", **fields)
    for role in ("encode", "prefill", "decode"):
        add(
            f"choose_worker/none_in_service/{role}",
            "every compatible worker out: a 503",
            "choose_worker",
            role=role,
            workers=workers(0, 0, down=(0, 1)),
        )

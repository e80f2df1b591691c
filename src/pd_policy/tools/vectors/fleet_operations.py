"""The conformance operation of fleet selection: which worker of a leg's kind takes it.

* ``choose_worker``: among ``workers`` (each ``name``, ``routable``, ``outstanding``, in
  the caller's order, all able to serve the leg), the index of the one
  [`choose`][pd_policy.fleet.balance.choose] picks for a ``role``, an ``affinity`` key, a
  ``bound``, a ``balance`` and two ``draws``; or the error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pd_policy.errors import MalformedRequest, PolicyError
from pd_policy.fleet.balance import DEFAULT_BOUND, Balance, WorkerSnapshot, choose

from .reading import error, field, opt_field

__all__ = ["FLEET_OPERATIONS"]


def _snapshot(i: int, item: object) -> WorkerSnapshot[int]:
    if not isinstance(item, Mapping):
        raise MalformedRequest("a worker must be an object", param=f"workers[{i}]")
    return WorkerSnapshot(
        field(item, "name", str),
        i,
        field(item, "routable", bool, default=True),
        field(item, "outstanding", int, default=0),
    )


def _choose_outcome(case: Mapping[str, Any]) -> dict[str, Any]:
    workers = [_snapshot(i, w) for i, w in enumerate(field(case, "workers", list))]
    draws = field(case, "draws", list, default=[0, 0])
    if len(draws) != 2 or not all(type(d) is int for d in draws):
        raise MalformedRequest("draws must be two integers", param="draws")
    try:
        balance = Balance(field(case, "balance", str, default=Balance.LEAST_OUTSTANDING.value))
    except ValueError:
        raise MalformedRequest("an unknown balance", param="balance") from None
    bound = case.get("bound", DEFAULT_BOUND)
    if type(bound) not in (int, float):
        raise MalformedRequest("must be a number", param="bound")
    try:
        chosen = choose(
            workers,
            role=field(case, "role", str),
            affinity=opt_field(case, "affinity", str),
            bound=float(bound),
            balance=balance,
            draws=(draws[0], draws[1]),
        )
    except PolicyError as exc:
        return error(exc)
    return {"status": 200, "chosen": chosen.handle}


#: The fleet operations, by name.
FLEET_OPERATIONS: Final = {"choose_worker": _choose_outcome}

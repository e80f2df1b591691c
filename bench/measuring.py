"""How the bench measures: medians per call, ratios timed back to back, percentiles and
verdicts against targets. Every bench script measures the same way through these."""

from __future__ import annotations

import statistics
import timeit
from collections.abc import Callable, Mapping, Sequence

#: A target: its label, its comparison ("<=" or ">="), its goal.
Target = tuple[str, str, float]


def median_seconds(fn: Callable[[], object], *, repeat: int, min_time: float = 0.0) -> float:
    """Median seconds per call: calibrate a loop count (at least ``min_time`` per loop), warm
    up, then ``repeat`` timed loops."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    while number * timer.timeit(1) < min_time and number < 1 << 22:
        number *= 2
    timer.timeit(number)  # warm-up
    return statistics.median(t / number for t in timer.repeat(repeat=repeat, number=number))


def paired_ratio(
    numerator: Callable[[], object], denominator: Callable[[], object], *, rounds: int
) -> float:
    """Median over ``rounds`` of (time of ``numerator`` ÷ time of ``denominator``), the two
    timed back to back in each round: on a shared machine whose speed drifts, a ratio of
    two medians taken minutes apart drifts with it, a ratio per round does not."""
    a, b = timeit.Timer(numerator), timeit.Timer(denominator)
    number, _ = a.autorange()
    a.timeit(number), b.timeit(number)  # warm-up
    return statistics.median(a.timeit(number) / b.timeit(number) for _ in range(rounds))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0 to 1) of ``values``, nearest rank; ``values`` must not be empty."""
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def verdicts(ratios: Mapping[str, float], targets: Mapping[str, Target]) -> dict[str, bool]:
    """Whether each target's ratio meets its goal."""
    met = {}
    for key, (_, op, goal) in targets.items():
        if op not in ("<=", ">="):
            raise ValueError(f"target {key!r}: comparison {op!r} is neither <= nor >=")
        met[key] = ratios[key] <= goal if op == "<=" else ratios[key] >= goal
    return met

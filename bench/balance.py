"""How well the core's choice balances a fleet under skewed traffic: a simulation in one run.

Four prefill workers, each serving one request at a time (a queue), take image requests
whose images follow a Zipf law (a few hot images, a long tail), and some text. Each
worker's prefix cache holds its last 16 images; a request whose image the chosen
worker holds is a hit, and takes a third of the time. Requests arrive at random
(Poisson) at 85% of the fleet's capacity without hits. Every choice is the core's
``choose`` over snapshots of the workers, as a router makes it; nothing here is timed
on the clock.

Per rule: the mean and p99 time in system (in units of one uncached service), how
far the busiest worker is above an even share (its outstanding requests less the
mean, rounded up) at the 99th percentile of arrivals and at worst, and the
prefix-cache hit rate. The rules: least outstanding; two random choices; affinity with the default
bound (1.25); affinity unbounded (a bound so large it never binds).
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import OrderedDict
from typing import Any

from measuring import percentile

from pd_policy import DEFAULT_BOUND, Balance, WorkerSnapshot, choose

#: The generated block of docs/performance.md.
NAME = "performance-balance"
WORKERS = 4
IMAGES = 200
REQUESTS = 20_000
TEXT_SHARE = 0.2
HIT_COST = 1 / 3
CACHE = 16
LOAD = 0.85
RULES = {
    "least outstanding": (Balance.LEAST_OUTSTANDING, None),
    "two choices": (Balance.TWO_CHOICES, None),
    "affinity, bound 1.25": (Balance.LEAST_OUTSTANDING, DEFAULT_BOUND),
    "affinity, unbounded": (Balance.LEAST_OUTSTANDING, 1e9),
}


def _zipf(rng: random.Random, n: int, s: float = 1.1) -> list[float]:
    weights = [1 / (k**s) for k in range(1, n + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def simulate(rule: str, seed: int = 0) -> dict[str, float]:
    """One rule's run over the same arrivals (``seed``)."""
    balance, bound = RULES[rule]
    rng = random.Random(seed)
    weights = _zipf(rng, IMAGES)
    names = [f"prefill-{i}" for i in range(WORKERS)]
    free_at = [0.0] * WORKERS  # when each worker's queue empties
    departures: list[list[float]] = [[] for _ in range(WORKERS)]  # heaps of finish times
    cached: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(WORKERS)]
    now, hits, images = 0.0, 0, 0
    times: list[float] = []
    peaks: list[float] = []
    for _ in range(REQUESTS):
        now += rng.expovariate(LOAD * WORKERS)
        for heap in departures:
            while heap and heap[0] <= now:
                heapq.heappop(heap)
        image = None if rng.random() < TEXT_SHARE else rng.choices(range(IMAGES), weights)[0]
        loads = [len(h) for h in departures]
        snapshots = [WorkerSnapshot(n, i, True, loads[i]) for i, n in enumerate(names)]
        draws = (rng.getrandbits(32), rng.getrandbits(32))
        affinity = f"image-{image}" if image is not None and bound is not None else None
        chosen = choose(
            snapshots, role="prefill", affinity=affinity, bound=bound or DEFAULT_BOUND,
            balance=balance, draws=draws,
        ).handle  # fmt: skip
        after = [loads[i] + (i == chosen) for i in range(WORKERS)]
        peaks.append(max(after) - math.ceil(sum(after) / WORKERS))
        cost = rng.expovariate(1.0)
        if image is not None:
            images += 1
            cache = cached[chosen]
            if image in cache:
                hits += 1
                cost *= HIT_COST
                cache.move_to_end(image)
            else:
                cache[image] = None
                if len(cache) > CACHE:
                    cache.popitem(last=False)
        start = max(now, free_at[chosen])
        free_at[chosen] = start + cost
        heapq.heappush(departures[chosen], free_at[chosen])
        times.append(free_at[chosen] - now)
    return {
        "mean_time": statistics.fmean(times),
        "p99_time": percentile(times, 0.99),
        "excess_p99": percentile(peaks, 0.99),
        "excess_max": max(peaks),
        "hit_rate": hits / images,
    }


def measure(quick: bool = False) -> dict[str, Any]:
    """Every rule over the same arrivals; see the module docs."""
    global REQUESTS
    if quick:
        REQUESTS = 4_000
    return {rule: simulate(rule) for rule in RULES}


def table(results: dict[str, Any]) -> str:
    """The simulation's figures, as a markdown table."""
    rows = [
        "| rule | mean time in system | p99 time in system | busiest worker over an even "
        "share: p99 / worst | prefix-cache hits |",
        "|---|---|---|---|---|",
    ]
    for rule, r in results.items():
        rows.append(
            f"| {rule} | {r['mean_time']:.2f} | {r['p99_time']:.2f} | "
            f"{r['excess_p99']:.0f} / {r['excess_max']:.0f} | {r['hit_rate']:.0%} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    import sys

    print(table(measure(quick="--quick" in sys.argv)))

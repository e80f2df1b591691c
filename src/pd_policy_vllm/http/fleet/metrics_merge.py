"""The ``/metrics`` of several processes of one proxy, as one exposition.

Each process of ``--processes N`` counts what it served and sees the fleet as its own
probes do; a scrape answers for all of them. Counters and histograms add up, sample by
sample (a label set one process has not seen counts as nothing there). A gauge says
something of the fleet or of the proxy, so each has its rule: a member's outstanding
requests, the legs waiting for a connection, the processes' memory and open files add
up; ``pd_policy_worker_up`` and ``pd_policy_kv_synced`` are the least of the processes'
(1 only when every process routes to the member, or counts its blocks), and so is the
start time; the rest are the greatest (a feed's lag, the blocks indexed, the restarts
counted, which each process knows as of its own start). ``*_created`` is the earliest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ADDED_GAUGES", "LEAST_GAUGES", "merge"]

#: The gauges whose merged value is the sum of the processes'.
ADDED_GAUGES: Final = frozenset(
    {
        "pd_policy_worker_outstanding", "pd_policy_upstream_waiting",
        "process_resident_memory_bytes", "process_virtual_memory_bytes", "process_open_fds",
    }
)  # fmt: skip
#: The gauges whose merged value is the least of the processes'.
LEAST_GAUGES: Final = frozenset(
    {"pd_policy_worker_up", "pd_policy_kv_synced", "process_start_time_seconds"}
)
#: The counters each process reports whole (as of its start): the greatest is the count.
_GREATEST_COUNTERS: Final = frozenset({"pd_policy_process_restarts"})

_Key = tuple[str, tuple[tuple[str, str], ...]]


def _rule(family: Metric) -> Callable[[float, float], float]:
    if family.name.endswith("_created"):
        return min
    if family.type == "gauge":
        if family.name in ADDED_GAUGES:
            return _add
        return min if family.name in LEAST_GAUGES else max
    return max if family.name in _GREATEST_COUNTERS else _add


def _add(a: float, b: float) -> float:
    return a + b


class _Families:
    # generate_latest takes anything that collects.
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> list[Metric]:
        return self.families


def merge(texts: Sequence[bytes]) -> bytes:
    """One exposition of every process's (Prometheus' text format), each family in the
    order it first appears. Raises ``ValueError`` for a text that is not the format."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[_Key, float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text.decode()):
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            rule, seen = _rule(family), values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                seen[key] = rule(seen[key], sample.value) if key in seen else sample.value
    for name, family in merged.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    return generate_latest(_Families(merged.values()))

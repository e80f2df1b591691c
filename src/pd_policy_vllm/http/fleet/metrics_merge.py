"""The ``/metrics`` of several processes of one proxy, as one exposition.

Each process of ``--processes N`` counts what it served and sees the fleet as its own
probes do; a scrape answers for all of them, each sample labelled with the ``process``
it came from (its slot, ``0`` to ``N-1``, which a restarted process takes over). So a
dashboard sums what it needs (``sum(rate(pd_policy_requests_total[1m]))``), and a
process that dies and comes back is, as Prometheus expects, a counter reset of its own
series: never a drop in a sum, which ``rate()`` would read as a burst the size of every
other process's count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["PROCESS_LABEL", "merge"]

#: The label that says which process a sample is of.
PROCESS_LABEL: Final = "process"


class _Families:
    # generate_latest takes anything that collects.
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> list[Metric]:
        return self.families


def merge(texts: Mapping[str, bytes]) -> bytes:
    """One exposition (Prometheus' text format) of every process's, by the process's
    name: each family once, in the order it first appears, its samples those of every
    process with the ``process`` label added. Raises ``ValueError`` for a text that is not
    the format."""
    merged: dict[str, Metric] = {}
    for process, text in texts.items():
        for family in text_string_to_metric_families(text.decode()):
            out = merged.get(family.name)
            if out is None:
                out = merged[family.name] = Metric(family.name, family.documentation,
                                                   family.type)  # fmt: skip
            for sample in family.samples:
                labels = {**sample.labels, PROCESS_LABEL: process}
                out.add_sample(sample.name, labels, sample.value)
    return generate_latest(_Families(merged.values()))

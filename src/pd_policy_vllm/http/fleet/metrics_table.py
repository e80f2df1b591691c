"""Every metric the proxy exposes, as a table: the docs' (``docs/observe.md``) is written
from it (``python -m pd_policy_vllm.http.fleet.metrics_table --write PAGE``), and a test
holds the exposition to it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from prometheus_client import ProcessCollector
from prometheus_client.metrics import MetricWrapperBase

from pd_policy_vllm.http.fleet.metrics import Metrics
from pd_policy_vllm.http.siblings import PROCESSES_HELP

__all__ = ["main", "metrics_table"]


#: The one metric a scrape of several processes adds
#: ([`siblings`][pd_policy_vllm.http.siblings]).
_PROCESSES: Final = (
    "pd_policy_processes",
    "gauge",
    (),
    PROCESSES_HELP,
)


def metrics_table() -> list[tuple[str, str, tuple[str, ...], str]]:
    """Every metric the proxy exposes, as scraped: its name (a counter's with
    ``_total``), kind, labels and help; the docs' table is made of it."""
    rows = []
    for collector in vars(Metrics()).values():
        if not isinstance(collector, MetricWrapperBase):
            continue
        (family,) = collector.describe()
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = tuple(collector._labelnames)
        rows.append((name, family.type, labels, family.documentation))
    for family in ProcessCollector(registry=None).collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        rows.append((name, family.type, (), family.documentation))
    rows.append(_PROCESSES)
    return rows


def _table() -> str:
    lines = ["| metric | kind | labels | what |", "|---|---|---|---|"]
    for name, kind, labels, what in metrics_table():
        shown = ", ".join(f"`{label}`" for label in labels)
        lines.append(f"| `{name}` | {kind} | {shown} | {what} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pd_policy_vllm.http.fleet.metrics_table --write PAGE``: the table of every
    metric, written into ``PAGE`` between its ``metrics-table`` markers."""
    cli = argparse.ArgumentParser(prog="python -m pd_policy_vllm.http.fleet.metrics_table")
    cli.add_argument("--write", type=Path, metavar="PAGE")
    args = cli.parse_args(argv)
    if args.write is None:
        sys.stdout.write(_table())
        return 0
    text = args.write.read_text()
    start, end = "<!-- metrics-table: start -->\n", "<!-- metrics-table: end -->"
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    args.write.write_text(head + start + _table() + end + tail)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

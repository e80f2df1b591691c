"""The flags of what the proxy tells an operator: its log lines' format, a port of its
own for ``/metrics``, and where its traces go (``docs/observe.md``)."""

from __future__ import annotations

import argparse

from pd_policy_vllm.http.config.values import ratio
from pd_policy_vllm.http.log_format import FORMATS

__all__ = ["add_observe_flags"]


def add_observe_flags(group: argparse._ArgumentGroup) -> None:
    """Add the logs', metrics' and traces' flags to ``group``."""
    add = group.add_argument
    add(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="log lines as text or as one JSON object each, with ISO-8601 timestamps (text)",
    )
    add(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="also serve /metrics on this port of --host, with no key: for a scraper "
        "inside the cluster (the API port's /metrics keeps its keys; off)",
    )
    add(
        "--otlp-traces-endpoint",
        metavar="URL",
        help="the OTLP collector the proxy's spans go to, as vLLM's flag (off); each leg "
        "carries its span's traceparent, so a traced vllm serve joins the trace",
    )
    add(
        "--otlp-traces-sample-ratio",
        type=ratio,
        default=1.0,
        help="the share of the traces the proxy starts that are sampled (1; a client's "
        "traceparent decides its own)",
    )

"""vLLM's gRPC launcher (SMG's Python servicer) with vLLM's Prometheus metrics served on a
loopback port: a test peer's way to read what its engine counted, NIXL's transfers among it.

Run: ``python grpc_metrics_launcher.py PORT LAUNCHER-ARGS...``. It serves the process's
default Prometheus registry at ``http://127.0.0.1:PORT/metrics``, then runs
``vllm.entrypoints.launchers.grpc_server`` as ``__main__`` with the rest of the arguments.

Why: the launcher's ``AsyncLLM`` keeps vLLM's Prometheus metrics (its stat loggers, the KV
connector's among them) in that registry, but nothing serves it. SMG's ``--metrics-port``
is the Rust servicer's only; with the Python servicer it stops the launcher (``--metrics-port
(or SMG_VLLM_SERVICER_METRICS_PORT) needs --servicer-impl rust: the Python servicer exposes
no metrics endpoint``). Tests only: a production servicer is run as SMG ships it.
"""

from __future__ import annotations

import runpy
import sys
from typing import Final

#: The launcher this one wraps.
LAUNCHER: Final = "vllm.entrypoints.launchers.grpc_server"


def main() -> None:
    from prometheus_client import start_http_server

    port, *rest = sys.argv[1:]
    # Before the engine starts: a port taken ends the process at once, with "Address
    # already in use", and the test's server starts again on other ports.
    start_http_server(int(port), addr="127.0.0.1")
    sys.argv = [LAUNCHER, *rest]
    runpy.run_module(LAUNCHER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

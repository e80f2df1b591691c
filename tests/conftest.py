"""Shared test configuration: Hypothesis profiles, and the fuzz report.

``ci`` (selected when ``CI`` is set, as on the CI runner) runs many more
examples than the default ``dev`` profile; ``fuzz`` (``make fuzz``) runs
100,000 per property. Pick one with ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os
import sys

# Set before any test imports vLLM (tests/vllm, and tests/grpc's KV routing, which runs its
# publisher): huggingface_hub reads HF_HUB_OFFLINE once, at import; the engines run in-process.
_TOO_EARLY = sorted({"vllm", "huggingface_hub"} & set(sys.modules))
assert not _TOO_EARLY, f"{_TOO_EARLY} imported before the tests set their environment"
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from fuzzing import EXAMPLES  # noqa: E402

settings.register_profile(
    "ci",
    max_examples=600,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=120, deadline=None)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "100000")),
    deadline=None,
    print_blob=True,
    # Long runs draw more of the strategies' large and filtered corners; none of that is
    # a defect of the code under test.
    suppress_health_check=list(HealthCheck),
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        name = report.nodeid.rpartition("::")[2].partition("[")[0]
        _seconds[name] = _seconds.get(name, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not EXAMPLES:
        return
    write = terminalreporter.write_line
    terminalreporter.section("fuzz: examples per property")
    write(f"{'property':<70} {'examples':>9} {'seconds':>8} {'per s':>7}")
    for name, count in sorted(EXAMPLES.items()):
        seconds = _seconds.get(name, 0.0)
        rate = f"{count / seconds:7.0f}" if seconds else "      -"
        write(f"{name:<70} {count:>9} {seconds:>8.1f} {rate}")

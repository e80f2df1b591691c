"""A test-environment switch for NIXL's progress thread, in the server processes of the tests.

Put on the ``PYTHONPATH`` of a NIXL worker of the live tests (only theirs: ``vllm serve``,
SMG's servicer, Ray's replicas; [`nixl_peers`][nixl_peers]), Python imports this module at
start-up, in each of the worker's processes. It does nothing unless
``PD_POLICY_TEST_NIXL_PROGRESS_THREAD`` is ``off``; then every NIXL agent the process creates
runs without its progress thread.

Why: each NIXL agent's UCX progress thread busy-polls a core, idle or not (an idle prefill at
about 98% of a core, a decode at about 67%); on the two cores of this project's machines that
slowed NIXL P/D several times over, and everything else running beside it. Without the thread
the agent progresses when vLLM polls it (each engine step checks its transfers), and loopback
transfers stay exact. vLLM builds the agent's configuration itself (``nixl_agent_config(
num_threads=..., capture_telemetry=True)`` in its NIXL worker) and lets no setting reach
``enable_prog_thread``: so the switch makes the configuration class of NIXL's backend module
turn it off, as that module is imported, before vLLM reads the class.

Never in ``src/``: production keeps NIXL as shipped.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

#: The switch, and the one value that turns the thread off.
SWITCH = "PD_POLICY_TEST_NIXL_PROGRESS_THREAD"
OFF = "off"
#: What an agent configuration made under the switch writes to the server's log (once).
MARK = "pd-policy test switch: NIXL agents without their progress thread"
#: NIXL's backend modules (the ``nixl`` meta package re-exports one of them as ``nixl._api``).
BACKENDS = frozenset({"nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api"})


def _without_progress_thread(module: ModuleType) -> None:
    config = module.nixl_agent_config
    original = config.__init__
    marked = False

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal marked
        original(self, *args, **kwargs)
        self.enable_pthread = False  # what nixl_agent reads for useProgThread
        if not marked:
            marked = True
            print(MARK, file=sys.stderr, flush=True)

    config.__init__ = init


class _Patching(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _without_progress_thread(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in BACKENDS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Patching(spec.loader)
        return spec


if os.environ.get(SWITCH) == OFF:
    sys.meta_path.insert(0, _Finder())

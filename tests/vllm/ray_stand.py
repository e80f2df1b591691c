"""A Ray Serve LLM P/D deployment on this CPU, as a process of its own (the tests' peer).

Run: ``python ray_stand.py CONFIG.json``. The config names the models' directories, the
transfer directory, the HTTP port, and the applications:

- ``policy`` (route ``/``), when ``model`` is set (the tiny LLaVA, ``model_id``):
  [`build_pd_policy_app`][pd_policy_ray.builder.build_pd_policy_app] with a full-vision
  prefill and ``decode_replicas`` language-model-only decode replicas;
- ``own`` (route ``/own``), when ``own`` is true: Ray's ``build_pd_openai_app`` with the
  same two configs (one decode replica), the path the adapter exists to replace;
- ``mrope`` (route ``/mrope``), when ``mrope_model`` is set (the tiny Qwen2-VL,
  ``mrope_model_id``): the policy's application with one full-vision prefill and one
  language-model-only decode replica, which takes M-RoPE metadata (its own transfers).

The applications' engines hand KV over on the project's ``TransferConnector`` (through
``transfers``), unless ``nixl`` gives, by role (``kv_producer``, ``kv_consumer``), the
``policy`` application's ``configs`` (vLLM's ``NixlConnector``) and its replicas' ``env``
(a NIXL side channel each, the tests' progress-thread switch). ``metrics_port`` is where
the cluster serves its Prometheus metrics (the engines' among them, exported every second).

The driver starts its own Ray cluster on 127.0.0.1 (more logical CPUs than the machine
has: every replica asks for some), writes ``{"ready": true, ...}``, with the cluster's
process ids, to the config's ``ready`` file once every application is running, and on
SIGTERM kills the cluster's whole process tree. The test stops it by its process group,
then kills by pid whatever the ready file names that is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from live_engines import BLOCK_SIZE, ENGINE_SETTINGS
from servers import BASE_ENV

#: What every engine runs with: the in-process test engines' settings and block size.
ENGINE: dict[str, Any] = {**ENGINE_SETTINGS, "block_size": BLOCK_SIZE}
#: The offline environment every replica gets. Not VLLM_ENABLE_V1_MULTIPROCESSING: Ray
#: runs a CPU engine on vLLM's multiprocessing executor whatever it says.
ENV = {k: v for k, v in BASE_ENV.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}


def llm_config(
    spec: dict[str, Any], role: str, *, lm_only: bool, replicas: int = 1, app: str = "policy"
) -> Any:
    from ray.serve.llm import LLMConfig

    from pd_policy_vllm.transfer_connector import kv_transfer_config

    mrope = app == "mrope"
    model, model_id = (
        (spec["mrope_model"], spec["mrope_model_id"]) if mrope
        else (spec["model"], spec["model_id"])
    )  # fmt: skip
    nixl = spec.get("nixl") if app == "policy" else None
    if nixl is not None:
        kv, env = nixl["configs"][role], {**ENV, **nixl["env"][role]}
    else:
        kv = kv_transfer_config(role, spec["mrope_transfers" if mrope else "transfers"])
        env = ENV
    engine = {**ENGINE, "kv_transfer_config": kv}
    if lm_only:
        engine["language_model_only"] = True
    return LLMConfig(
        model_loading_config={"model_id": model_id, "model_source": model},
        accelerator_config={"kind": "cpu"},
        engine_kwargs=engine,
        deployment_config={"num_replicas": replicas},
        runtime_env={"env_vars": env},
    )


def main(path: str) -> None:
    spec = json.loads(Path(path).read_text())
    import ray
    from ray import serve
    from ray.serve.llm import build_pd_openai_app

    from pd_policy_ray import build_pd_policy_app

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    # Idle workers (left by Ray LLM's model-download tasks) are ended at once: each holds
    # about 1 GB, and five of them stayed up otherwise.
    system: dict[str, Any] = {"idle_worker_killing_time_threshold_ms": 100,
                              "num_workers_soft_limit": 0}  # fmt: skip
    if spec.get("metrics_port"):
        system["metrics_report_interval_ms"] = 1000
    ray.init(num_cpus=32, include_dashboard=False, _node_ip_address="127.0.0.1",
             _metrics_export_port=spec.get("metrics_port"),
             _system_config=system)  # fmt: skip
    try:
        serve.start(
            http_options={"host": "127.0.0.1", "port": spec["port"]},
            logging_config={"enable_access_log": True},
        )
        if spec.get("model"):
            prefill = llm_config(spec, "kv_producer", lm_only=False)
            decode = llm_config(spec, "kv_consumer", lm_only=True,
                                replicas=spec["decode_replicas"])  # fmt: skip
            serve.run(build_pd_policy_app(prefill, decode), name="policy", route_prefix="/",
                      blocking=False)  # fmt: skip
        if spec.get("mrope_model"):
            prefill = llm_config(spec, "kv_producer", lm_only=False, app="mrope")
            decode = llm_config(spec, "kv_consumer", lm_only=True, app="mrope")
            serve.run(build_pd_policy_app(prefill, decode), name="mrope", route_prefix="/mrope",
                      blocking=False)  # fmt: skip
        if spec.get("own") and spec.get("model"):
            own = build_pd_openai_app(
                {"prefill_config": llm_config(spec, "kv_producer", lm_only=False),
                 "decode_config": llm_config(spec, "kv_consumer", lm_only=True)}
            )  # fmt: skip
            serve.run(own, name="own", route_prefix="/own", blocking=False)
        while not stop.is_set():
            status = serve.status().applications
            if all(a.status == "RUNNING" for a in status.values()) and status:
                break
            if any(a.status in ("DEPLOY_FAILED", "UNHEALTHY") for a in status.values()):
                raise RuntimeError(f"a Ray application failed: {status}")
            time.sleep(1.0)
        logs = Path(_session_dir()) / "logs" / "serve"
        # Replicas start their engines in process groups of their own, which the test's
        # kill of this driver's group does not reach: it kills these too, by pid.
        tree = _descendants(os.getpid())
        Path(spec["ready"]).write_text(
            json.dumps({"ready": True, "serve_logs": str(logs), "pids": tree})
        )
        stop.wait()
    finally:
        # Nothing of the cluster is kept: the whole tree goes at once, since a graceful
        # shutdown of five engines can outlast the test's patience and leave them orphaned.
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def _session_dir() -> str:
    import ray

    node = ray._private.worker.global_worker.node
    return str(node.get_session_dir_path())


if __name__ == "__main__":
    os.environ.update(ENV)
    main(sys.argv[1])

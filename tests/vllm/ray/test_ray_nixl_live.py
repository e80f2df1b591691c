"""Ray Serve LLM's P/D with the policy's decode server on vLLM's own ``NixlConnector``,
against a full-vision engine.

The deployment (``ray_nixl``, ``ray_fleet.ray_nixl_fleet``: one driver process with its own
Ray cluster on 127.0.0.1, stopped by its process group) runs
[`build_pd_policy_app`][pd_policy_ray.builder.build_pd_policy_app] on the tiny LLaVA: a
full-vision prefill (``kv_producer``) and one ``language_model_only`` decode replica
(``kv_consumer``), both with their KV in host memory. Ray's own NIXL backend sets each
engine's side channel up; the tests give each its host and port (127.0.0.1, a port of its
own) and NIXL's progress-thread switch through the replicas' environment.

A transfer is proven by the decode replica's NIXL metrics, which vLLM records through
Ray's metrics (``log_engine_metrics``, Ray Serve LLM's default) and the cluster serves on
its metrics port as ``ray_vllm_nixl_...``, each series labelled with its replica's id:
read before and after each request. Never by ``cached_tokens``.

The baseline is a full-vision engine of the same model in this process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from nixl_peers import SWITCH_MARK, Transfer, progress_thread_off
from ray_chat import answer, ask, body, close, engine_answers
from ray_fleet import RayFleet
from tiny_models import TinyModel


@pytest.fixture(scope="module")
def baseline(llava: TinyModel) -> Any:
    """What one full-vision engine answers, by image: texts, logprobs, prompt lengths."""
    return engine_answers(llava)


def decode_replica(fleet: RayFleet) -> str:
    """The id of the one decode replica, which its NIXL series are labelled with."""
    (replica,) = fleet.capability_lines()
    return replica


def test_the_decode_replica_reads_itself_as_language_model_only_on_nixl(
    ray_nixl: RayFleet,
) -> None:
    (line,) = ray_nixl.capability_lines().values()
    assert "supports_vision=FALSE" in line and "kv=NIXL" in line
    # Both engines' NIXL agents were made under the switch (or none, with it on).
    logs = Path(ray_nixl.serve_logs).parent.glob("worker-*.err")
    marked = sum(SWITCH_MARK in log.read_text(errors="replace") for log in logs)
    assert marked == (2 if progress_thread_off() else 0)


def test_images_a_b_a_equal_a_full_vision_engine(ray_nixl: RayFleet, baseline: Any) -> None:
    assert baseline["A"][0] != baseline["B"][0]  # the images tell the answers apart
    replica = {"ReplicaId": decode_replica(ray_nixl)}
    for picture in ("A", "B", "A"):
        with Transfer(ray_nixl.metrics, replica):
            status, reply = ask(ray_nixl.url, body(picture))
        assert status == 200, reply
        text, logprobs = answer(reply)
        want_text, want_logprobs, prompt = baseline[picture]
        assert text == want_text, picture
        assert close(logprobs, want_logprobs), picture
        assert reply["usage"]["prompt_tokens"] == prompt


def test_text_equals_the_engine(ray_nixl: RayFleet, baseline: Any) -> None:
    with Transfer(ray_nixl.metrics, {"ReplicaId": decode_replica(ray_nixl)}):
        status, reply = ask(ray_nixl.url, body(None))
    assert status == 200, reply
    text, logprobs = answer(reply)
    assert text == baseline[None][0]
    assert close(logprobs, baseline[None][1])

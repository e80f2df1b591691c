"""SMG's vLLM gRPC servicer (``smg-grpc-servicer``) as a real peer, on tiny local models.

The servicer runs under vLLM's own launcher,
``python -m vllm.entrypoints.launchers.grpc_server``, with the settings the
measurements in ``smg-servicer-on-cpu.md`` call for: SMG's warm-up off (it
crashes connector engines), its KV-events publisher off (it binds on all
interfaces), a small KV cache, fp32, eager, block size 32, and the project's
``TransferConnector`` where the server takes part in P/D (or another connector's whole
config: vLLM's ``NixlConnector``, with ``nixl_peers.nixl_worker``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

import attrs
from grpc_health.v1 import health_pb2, health_pb2_grpc
from live_engines import BLOCK_SIZE
from servers import ENGINE_ARGS, Server, candidate_ports
from tiny_models import TinyModel

import grpc
from pd_policy_grpc.wire import pb
from pd_policy_vllm.transfer_connector import kv_transfer_config

__all__ = ["SMG_ENV", "Recorder", "Streamed", "metrics_url", "servicer", "streamed"]

#: The launcher that also serves vLLM's Prometheus metrics (``servicer(metrics=True)``).
METRICS_LAUNCHER: Final = Path(__file__).with_name("grpc_metrics_launcher.py")
#: SMG's planned warm-up crashes connector engines; its KV-events publisher binds on all
#: interfaces by default.
SMG_ENV: Final = {"SMG_VLLM_SERVICER_WARMUP": "off", "SMG_VLLM_SERVICER_KV_EVENTS": "0"}


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=2
        )
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _servicer_ready(server: Server) -> bool:
    return _serving(server.address)


def servicer(
    name: str,
    model: TinyModel,
    logs: Path,
    *,
    language_model_only: bool = False,
    limits: dict[str, int] | None = None,
    kv_role: str | None = None,
    transfer_dir: Path | None = None,
    kv_config: dict[str, Any] | None = None,
    metrics: bool = False,
    port: int | None = None,
    extra: tuple[str, ...] = (),
) -> Server:
    """A servicer of ``model`` on a loopback port, not yet started (its address: the
    server's ``address``, once started).

    Full vision takes ``limits`` media per prompt (one image by default);
    ``language_model_only`` serves no media. ``kv_role`` (``kv_producer``,
    ``kv_consumer``) plugs in the ``TransferConnector`` over ``transfer_dir``; ``kv_config``
    is another whole ``--kv-transfer-config``. With ``metrics``, vLLM's Prometheus
    metrics are served on the server's second port (``metrics_url``; the launcher of
    ``grpc_metrics_launcher.py``). ``port`` restarts a servicer where it was (else the
    server chooses, and chooses again when its port is taken). ``extra`` are more flags.
    """
    argv = [
        "-m", "vllm.entrypoints.launchers.grpc_server",
        "--host", "127.0.0.1",
        "--model", str(model.path),
        "--dtype", "float32", "--enforce-eager", "--seed", "0",
        "--max-model-len", "1024", "--max-num-seqs", "4",
        "--block-size", str(BLOCK_SIZE),
        "--kv-cache-memory-bytes", str(64 * 2**20),
        *ENGINE_ARGS,
    ]  # fmt: skip
    if language_model_only:
        argv.append("--language-model-only")
    else:
        argv += ["--limit-mm-per-prompt", json.dumps(limits or {"image": 1})]
    if kv_role is not None:
        assert transfer_dir is not None and kv_config is None
        kv_config = kv_transfer_config(kv_role, transfer_dir)
    if kv_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_config)]
    argv += extra

    def command(ports: tuple[int, ...]) -> list[str]:
        if metrics:
            return [str(METRICS_LAUNCHER), str(ports[1]), *argv[2:], "--port", str(ports[0])]
        return [*argv, "--port", str(ports[0])]

    assert port is None or not metrics  # a restart where it was keeps no metrics port
    count = 2 if metrics else 1
    return Server(
        name, command, logs / f"{name}.log", _servicer_ready, dict(SMG_ENV),
        ports=(port,) if port is not None else candidate_ports(count), fixed=port is not None,
    )  # fmt: skip


def metrics_url(server: Server) -> str:
    """Where a servicer started with ``metrics`` serves vLLM's Prometheus metrics."""
    return f"http://127.0.0.1:{server.ports[1]}"


class Recorder(grpc.aio.UnaryStreamClientInterceptor):
    """A client interceptor that records every streaming RPC a channel sends (``Generate``)."""

    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> Any:
        method = client_call_details.method
        self.methods.append(method.decode() if isinstance(method, bytes) else str(method))
        return await continuation(client_call_details, request)

    @property
    def generates(self) -> int:
        return sum(m.endswith("/Generate") for m in self.methods)


@attrs.frozen
class Streamed:
    """What a ``Generate`` stream returned: the tokens, and its ``GenerateComplete``."""

    tokens: list[int]
    complete: pb.GenerateComplete
    #: Each sampled token's log-probability, when the request asked for them.
    logprobs: list[float] = attrs.field(factory=list)

    @property
    def kv_report(self) -> dict[str, Any]:
        """The decode engine's connector report (``loaded_tokens``, ``local_cached_tokens``)."""
        report: dict[str, Any] = json.loads(self.complete.kv_transfer_params_json or "{}")
        return report


async def streamed(responses: AsyncIterator[pb.GenerateResponse]) -> Streamed:
    """Collect a stream: chunks carry deltas, and so does a streamed completion."""
    tokens: list[int] = []
    logprobs: list[float] = []
    complete = None
    async for response in responses:
        if response.HasField("chunk"):
            tokens.extend(response.chunk.token_ids)
            logprobs.extend(response.chunk.output_logprobs.token_logprobs)
        elif response.HasField("complete"):
            complete = response.complete
    assert complete is not None, "the stream ended without a completion"
    if not tokens:
        tokens = list(complete.output_ids)
        logprobs = list(complete.output_logprobs.token_logprobs)
    return Streamed(tokens, complete, logprobs)

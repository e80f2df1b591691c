"""A gRPC fleet's workers: each one's address, channel and capability, and what its own
``GetModelInfo`` and ``GetServerInfo`` say of it (how a prefill hands KV over, its KV
cache's blocks). [`FleetPd`][pd_policy_grpc.fleet.FleetPd] routes over them, and
[`KvRouting`][pd_policy_grpc.kv_routing.KvRouting] follows its prefills' KV events.
"""

from __future__ import annotations

import attrs

import grpc
from pd_policy import (
    DEFAULT_BOOTSTRAP_PORT,
    KvConnectorMode,
    PrefillKv,
    RosterMember,
    WorkerCapability,
)
from pd_policy_grpc.capability import capability_from_info
from pd_policy_grpc.kv import prefill_kv_from_info
from pd_policy_grpc.wire import pb, pb_grpc

__all__ = ["GrpcWorker", "Member", "describe_worker"]


@attrs.frozen(slots=True)
class GrpcWorker:
    """One gRPC worker: its ``address`` (``host:port``, an IPv6 host in brackets), its
    channel, its capability, for a prefill how it hands KV over, and what its KV cache's
    blocks are as ``GetServerInfo`` says: ``block_size`` tokens each (0: it does not
    say) over ``data_parallel_size`` ranks (KV-event routing needs both,
    [`kv_routing`][pd_policy_grpc.kv_routing])."""

    address: str
    channel: grpc.aio.Channel = attrs.field(eq=False, repr=False)
    capability: WorkerCapability
    kv: PrefillKv | None = None
    block_size: int = 0
    data_parallel_size: int = 1


async def describe_worker(
    channel: grpc.aio.Channel,
    address: str,
    role: str,
    *,
    kv_mode: KvConnectorMode | None = None,
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT,
    timeout: float = 10.0,
) -> GrpcWorker:
    """The worker at ``address`` as its own ``GetModelInfo`` and ``GetServerInfo`` describe
    it (``kv_mode`` and ``bootstrap_port``: the operator's, for a prefill). Raises
    ``grpc.aio.AioRpcError`` when it cannot be asked, and
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a prefill
    whose connector's contract is unknown."""
    stub = pb_grpc.VllmEngineStub(channel)
    model = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout)
    server = await stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=timeout)
    kv = None
    if role == "prefill":
        kv = prefill_kv_from_info(server, address, mode=kv_mode, bootstrap_port=bootstrap_port)
    capability = capability_from_info(model, server)
    ranks = max(server.data_parallel_size, 1)  # 0: a servicer that predates the field
    return GrpcWorker(address, channel, capability, kv, server.block_size, ranks)


#: A member of a gRPC fleet.
Member = RosterMember[GrpcWorker]

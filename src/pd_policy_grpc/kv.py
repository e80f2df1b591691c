"""The prefill leg and the KV handoff on the wire.

The handoff's rules are the core's ([`pd_policy.connectors`][pd_policy.connectors]): the prefill
worker's connector names its contract, and
[`pd_policy.plan_kv_handoff`][pd_policy.connectors.plan_kv_handoff]
says what each leg carries. This module reads the facts off the worker's
``GetServerInfoResponse`` and applies a [`pd_policy.KvHandoff`][pd_policy.connectors.KvHandoff] to
the
``GenerateRequest`` messages.
"""

from __future__ import annotations

from pd_policy import (
    DEFAULT_BOOTSTRAP_PORT,
    MROPE_GRID_KEYS,
    DecodeForm,
    KvConnectorMode,
    KvHandoff,
    PrefillKv,
    check_kv_handoff,
    connector_mode,
)
from pd_policy.authority import split_host_port

from .view import batches_with_paths, has_mm_inputs, kv_handoff_facts
from .wire import pb

__all__ = [
    "apply_kv_handoff",
    "ensure_kv_handoff",
    "kv_mode_from_server_info",
    "prefill_kv_from_info",
    "prefill_leg",
    "relay_kv",
]


def kv_mode_from_server_info(server_info: pb.GetServerInfoResponse) -> KvConnectorMode:
    """The handoff contract of the prefill worker's ``kv_connector`` (see
    [`pd_policy.connector_mode`][pd_policy.wires.connector_mode]).

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a connector whose
    contract is unknown: pass the mode explicitly for it.
    """
    return connector_mode(server_info.kv_connector)


def _host(address: str) -> str:
    # "host:port", "[v6]:port", "dns:///host:port", gRPC's "ipv6:[v6]:port", a bare host or
    # a bare IPv6 address (kept whole: "fe80::1" has no port).
    address = address.rpartition("///")[2]
    for scheme in ("ipv4:", "ipv6:", "dns:"):
        if address.startswith(scheme):
            address = address[len(scheme) :]
    return split_host_port(address)[0]


def prefill_kv_from_info(
    server_info: pb.GetServerInfoResponse,
    address: str,
    *,
    mode: KvConnectorMode | None = None,
    bootstrap_port: int = DEFAULT_BOOTSTRAP_PORT,
    dp_rank: int | None = None,
) -> PrefillKv:
    """What the router needs about the prefill worker at ``address`` to plan the handoff.

    ``mode`` defaults to [`kv_mode_from_server_info`][pd_policy_grpc.kv.kv_mode_from_server_info];
    give it for a
    connector this library does not know. The Mooncake engine id is the
    worker's ``kv_engine_id``, the bootstrap host is ``address``'s host (as
    SMG's gateway takes it), and the data-parallel size its
    ``data_parallel_size``. ``bootstrap_port`` is the operator's Mooncake
    bootstrap port (the worker does not report it); ``dp_rank`` the rank this
    router pins, if any.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] as
    [`pd_policy.PrefillKv`][pd_policy.connectors.PrefillKv] does.
    """
    return PrefillKv(
        mode=mode if mode is not None else kv_mode_from_server_info(server_info),
        engine_id=server_info.kv_engine_id,
        bootstrap_host=_host(address),
        bootstrap_port=bootstrap_port,
        dp_size=max(server_info.data_parallel_size, 1),
        dp_rank=dp_rank,
    )


def _keep_grids_on_cpu(batch: pb.MultimodalInputs) -> None:
    # Reads the map's keys only: no tensor payload is touched.
    listed = set(batch.keep_on_cpu_keys)
    missing = sorted(k for k in batch.model_specific_tensors if k in MROPE_GRID_KEYS)
    batch.keep_on_cpu_keys.extend(k for k in missing if k not in listed)


def sanitise_prefill_sampling(params: pb.SamplingParams) -> None:
    """Make ``params`` a prefill leg's, in place: one token (``max_tokens=1``,
    ``min_tokens=0``), one sample, no stop strings or ids, ``ignore_eos``. The message leg
    and the byte leg both build theirs with it."""
    params.max_tokens = 1
    params.min_tokens = 0
    params.n = 1
    params.ClearField("stop")
    params.ClearField("stop_token_ids")
    params.ignore_eos = True


def prefill_leg(
    request: pb.GenerateRequest, handoff: KvHandoff, *, in_place: bool = False
) -> pb.GenerateRequest:
    """The sanitised prefill leg under ``handoff`` (see
    [`pd_policy.prefill_leg`][pd_policy.prefill.prefill_leg]).

    Sets ``max_tokens=1``, ``min_tokens=0``, ``n=1``, clears ``stop`` and
    ``stop_token_ids``, sets ``ignore_eos`` and ``stream=false``; tags
    ``kv_transfer_params_json`` with the handoff's prefill parameters and pins
    its data-parallel rank, when it has them; lists every M-RoPE grid in its
    batch's ``keep_on_cpu_keys``. Every multimodal field is kept.

    By default the leg is a copy; ``in_place=True`` sanitises ``request``
    itself, for a router that owns the message and would rather not copy its
    pixels. Raises ``ValueError`` for a handoff that runs no prefill (n>1).
    """
    if not handoff.runs_prefill:
        raise ValueError("this handoff runs no prefill leg (n>1: decode runs alone)")
    if in_place:
        leg = request
    else:
        leg = pb.GenerateRequest()
        leg.CopyFrom(request)
    sanitise_prefill_sampling(leg.sampling_params)
    leg.stream = False
    if handoff.prefill_params is not None:
        leg.kv_transfer_params_json = handoff.prefill_params
    if handoff.dp_rank is not None:
        leg.data_parallel_rank = handoff.dp_rank
    for _, batch in batches_with_paths(leg):
        _keep_grids_on_cpu(batch)
    return leg


def apply_kv_handoff(leg: pb.GenerateRequest, handoff: KvHandoff) -> pb.GenerateRequest:
    """Put on the decode ``leg`` what ``handoff`` sends before prefill (in place; returned).

    A minted Mooncake transfer replaces ``kv_transfer_params_json``; the legacy
    host and port are set as the typed ``kv_transfer_params``.
    """
    if handoff.decode_params is not None:
        leg.kv_transfer_params_json = handoff.decode_params
    if handoff.decode_legacy is not None:
        leg.kv_transfer_params.remote_host = handoff.decode_legacy.remote_host
        leg.kv_transfer_params.remote_port = handoff.decode_legacy.remote_port
    return leg


def relay_kv(leg: pb.GenerateRequest, complete: pb.GenerateComplete) -> pb.GenerateRequest:
    """Put the KV parameters the prefill returned on the decode ``leg`` (in place; returned).

    Relays ``kv_transfer_params_json`` verbatim and the legacy typed
    ``kv_transfer_params`` when the prefill set them; an empty JSON text counts
    as nothing returned. Nothing is relayed when the leg asks for n>1. Call it
    only when the handoff relays
    ([`pd_policy.KvHandoff.relays`][pd_policy.connectors.KvHandoff.relays]).
    """
    if leg.sampling_params.n > 1:
        return leg
    if complete.kv_transfer_params_json:
        leg.kv_transfer_params_json = complete.kv_transfer_params_json
    if complete.HasField("kv_transfer_params"):
        leg.kv_transfer_params.CopyFrom(complete.kv_transfer_params)
    return leg


def ensure_kv_handoff(
    original: pb.GenerateRequest,
    form: DecodeForm,
    leg: pb.GenerateRequest,
    mode: KvConnectorMode,
) -> None:
    """The post-prefill check (see
    [`pd_policy.ensure_kv_handoff`][pd_policy.handoff.ensure_kv_handoff]), for the prefill
    worker's connector contract ``mode``.

    Raises [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams] (502) when a
    stripped multimodal leg carries no KV form complete for ``mode``; text keeps the
    recompute fallback.
    """
    params, legacy = kv_handoff_facts(leg)
    check_kv_handoff(
        form,
        has_mm_inputs=has_mm_inputs(original),
        kv_transfer_params=params,
        kv_legacy=legacy,
        mode=mode,
    )

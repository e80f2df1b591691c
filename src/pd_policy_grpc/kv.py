"""The prefill leg and the KV handoff on the wire.

``KvConnectorMode`` is read from the *prefill* worker (its ``kv_connector``).
With NIXL the prefill leg is tagged for remote decode and the parameters its
``GenerateComplete`` returns are relayed to the decode leg; with passthrough
nothing is tagged and whatever the engine returns is relayed. The handoff has a
single consumer, so nothing is tagged or relayed when n>1.
"""

from __future__ import annotations

import enum
from typing import Final

from pd_policy import DecodeForm, check_kv_handoff

from .view import has_kv_transfer_params, has_mm_inputs
from .wire import pb

__all__ = [
    "NIXL_PREFILL_PARAMS",
    "KvConnectorMode",
    "ensure_kv_handoff",
    "kv_mode_from_server_info",
    "prefill_leg",
    "relay_kv",
]

#: What a NIXL prefill leg is tagged with: save the KV for a remote decode.
NIXL_PREFILL_PARAMS: Final = '{"do_remote_decode":true,"do_remote_prefill":false}'


class KvConnectorMode(enum.Enum):
    """How the prefill worker hands KV to the decode worker."""

    NIXL = "nixl"
    PASSTHROUGH = "passthrough"


def kv_mode_from_server_info(server_info: pb.GetServerInfoResponse) -> KvConnectorMode:
    """NIXL when the prefill worker's connector is NIXL, passthrough otherwise."""
    connector = server_info.kv_connector.lower()
    return KvConnectorMode.NIXL if connector.startswith("nixl") else KvConnectorMode.PASSTHROUGH


def prefill_leg(
    request: pb.GenerateRequest,
    mode: KvConnectorMode = KvConnectorMode.NIXL,
    *,
    in_place: bool = False,
) -> pb.GenerateRequest:
    """The sanitised prefill leg: one token, no stops, no streaming, tagged for the handoff.

    Sets ``max_tokens=1``, ``min_tokens=0``, ``n=1``, clears ``stop`` and
    ``stop_token_ids``, sets ``ignore_eos`` and ``stream=false``. With NIXL and
    n<=1 it sets ``kv_transfer_params_json`` to :data:`NIXL_PREFILL_PARAMS`.
    The prefill keeps every multimodal field. By default the leg is a copy;
    ``in_place=True`` sanitises ``request`` itself, for a router that owns the
    message and would rather not copy its pixels.
    """
    relays = request.sampling_params.n <= 1
    if in_place:
        leg = request
    else:
        leg = pb.GenerateRequest()
        leg.CopyFrom(request)
    params = leg.sampling_params
    params.max_tokens = 1
    params.min_tokens = 0
    params.n = 1
    params.ClearField("stop")
    params.ClearField("stop_token_ids")
    params.ignore_eos = True
    leg.stream = False
    if mode is KvConnectorMode.NIXL and relays:
        leg.kv_transfer_params_json = NIXL_PREFILL_PARAMS
    return leg


def relay_kv(leg: pb.GenerateRequest, complete: pb.GenerateComplete) -> pb.GenerateRequest:
    """Put the KV parameters the prefill returned on the decode ``leg`` (in place; returned).

    Relays ``kv_transfer_params_json`` verbatim and the legacy typed
    ``kv_transfer_params`` when the prefill set them; an empty JSON text counts
    as nothing returned. Nothing is relayed when the leg asks for n>1.
    """
    if leg.sampling_params.n > 1:
        return leg
    if complete.kv_transfer_params_json:
        leg.kv_transfer_params_json = complete.kv_transfer_params_json
    if complete.HasField("kv_transfer_params"):
        leg.kv_transfer_params.CopyFrom(complete.kv_transfer_params)
    return leg


def ensure_kv_handoff(
    original: pb.GenerateRequest, form: DecodeForm, leg: pb.GenerateRequest
) -> None:
    """The post-prefill check (see :func:`pd_policy.ensure_kv_handoff`).

    Raises :class:`~pd_policy.MissingKvTransferParams` (502) when a stripped
    multimodal leg carries neither KV form; text keeps the recompute fallback.
    """
    check_kv_handoff(
        form,
        has_mm_inputs=has_mm_inputs(original),
        has_kv_transfer_params=has_kv_transfer_params(leg),
    )

"""How the prefill worker hands its KV to the decode worker, by KV connector.

vLLM names a worker's connector in its ``kv_transfer_config`` (SMG's servicer
reports it as ``GetServerInfoResponse.kv_connector``). Each connector follows
one of four handoff contracts, read off the *prefill* worker:

* ``NIXL``: the prefill leg is tagged ``{"do_remote_decode": true, ...}`` and
  the parameters its engine returns are relayed to the decode leg.
* ``NIXL_PUSH``: the same wire, but the prefill pushes to the decode it matches by
  request id, and the id carries the route's prefix: both legs must go to one route
  ([`legs_share_route`][pd_policy.connectors.KvConnectorMode.legs_share_route]).
* ``TRANSFER``: pd-policy's own CPU ``TransferConnector``, tagged and relayed
  as NIXL is; it names its KV by a transfer id, not by NIXL's engine and blocks.
* ``MOONCAKE``: the router mints a transfer id and tells both legs up front.
  Without an engine id for the prefill worker (or under data parallelism with
  no pinned rank) it falls back to the legacy typed host and port, on every
  decode leg, n>1 included.
* ``PASSTHROUGH``: nothing is tagged; whatever the engine returns is relayed.

The handoff has a single consumer, so a request with n>1 gets no prefill leg
at all: its decode leg runs alone and recomputes the prompt.

Which connector follows which contract, and which are refused, is
[`pd_policy.wires`][pd_policy.wires].
[`plan_kv_handoff`][pd_policy.connectors.plan_kv_handoff] turns these rules into data,
[`KvHandoff`][pd_policy.connectors.KvHandoff], so
every adapter applies the same plan.
"""

from __future__ import annotations

import enum
import json
import os
import time
import uuid
from typing import Final

import attrs

from .authority import authority
from .errors import InvalidConfiguration
from .fields import instance_of, redacted_repr
from .request import LegacyKvParams, Request

__all__ = [
    "DEFAULT_BOOTSTRAP_PORT",
    "NIXL_PREFILL_PARAMS",
    "KvConnectorMode",
    "KvHandoff",
    "PrefillKv",
    "apply_kv_handoff",
    "mint_transfer_id",
    "plan_kv_handoff",
]


class KvConnectorMode(enum.Enum):
    """The handoff contract a prefill worker's KV connector follows."""

    NIXL = "nixl"
    NIXL_PUSH = "nixl_push"
    TRANSFER = "transfer"
    MOONCAKE = "mooncake"
    PASSTHROUGH = "passthrough"

    @property
    def legs_share_route(self) -> bool:
        """Whether the decode is paired with the prefill by request id *and* route: the
        route's prefix is part of vLLM's request id (``chatcmpl-``, ``cmpl-``,
        ``generate-tokens-``), so both legs must go to one route, under one
        ``X-Request-Id`` ([`check_leg_routes`][pd_policy.wires.check_leg_routes])."""
        return self is KvConnectorMode.NIXL_PUSH


#: The bootstrap port of a Mooncake prefill worker when its operator names none.
DEFAULT_BOOTSTRAP_PORT: Final = 8998

#: What a NIXL prefill leg is tagged with: keep the KV for a remote decode.
NIXL_PREFILL_PARAMS: Final = '{"do_remote_decode":true,"do_remote_prefill":false}'


def _check_port(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 1 <= value <= 65535:
        raise InvalidConfiguration(
            "bootstrap_port must be an integer in 1..65535", "bootstrap_port"
        )


def _check_dp_size(_inst: object, _attr: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value < 1:
        raise InvalidConfiguration("dp_size must be a positive integer", "dp_size")


def _check_lease(_inst: object, _attr: attrs.Attribute[float | None], value: float | None) -> None:
    if value is None:
        return
    if type(value) not in (int, float) or not 0 < value < float("inf"):
        raise InvalidConfiguration("lease must be a positive number of seconds", "lease")


def _empty_to_none(value: object) -> object:
    return None if value == "" else value


@attrs.frozen(slots=True)
class PrefillKv:
    """What a router knows about how its prefill worker hands KV over.

    ``mode`` is the connector's contract. For ``MOONCAKE``: ``engine_id`` is
    the worker's ``kv_engine_id`` (empty or ``None`` when it reports none),
    ``bootstrap_host`` the host of the worker's address and ``bootstrap_port``
    the operator's Mooncake bootstrap port; ``dp_size`` and ``dp_rank`` are its
    data parallelism and the rank this router pins, if any. ``lease``: the seconds it
    keeps a request's KV for the decode after it answers (NIXL's ``kv_lease_duration``,
    [`kv_lease`][pd_policy.kv_lease]); ``None`` when it keeps it without a lease.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for Mooncake
    without a bootstrap host, a port outside 1..65535, a data-parallel size
    below 1, a rank outside it, or a lease that is not a positive number.
    """

    mode: KvConnectorMode = attrs.field(
        validator=instance_of(KvConnectorMode, error=InvalidConfiguration)
    )
    engine_id: str | None = attrs.field(
        default=None,
        converter=_empty_to_none,
        validator=instance_of(str, optional=True, error=InvalidConfiguration),
        repr=redacted_repr,
    )
    bootstrap_host: str | None = attrs.field(
        default=None,
        converter=_empty_to_none,
        validator=instance_of(str, optional=True, error=InvalidConfiguration),
        repr=redacted_repr,
    )
    bootstrap_port: int = attrs.field(default=DEFAULT_BOOTSTRAP_PORT, validator=_check_port)
    dp_size: int = attrs.field(default=1, validator=_check_dp_size)
    dp_rank: int | None = attrs.field(default=None)
    lease: float | None = attrs.field(default=None, validator=_check_lease)

    def __attrs_post_init__(self) -> None:
        if self.mode is KvConnectorMode.MOONCAKE and self.bootstrap_host is None:
            raise InvalidConfiguration(
                "a Mooncake prefill worker needs its bootstrap host", param="bootstrap_host"
            )
        rank = self.dp_rank
        if rank is not None and (type(rank) is not int or not 0 <= rank < self.dp_size):
            raise InvalidConfiguration(
                f"dp_rank must be an integer in 0..{self.dp_size - 1}", param="dp_rank"
            )

    @property
    def mooncake_engine_id(self) -> str | None:
        """The engine id a Mooncake decode leg names, or ``None`` when none can be minted.

        Under data parallelism each engine core serves ``{engine_id}_dp{rank}``,
        so a worker with ``dp_size`` above 1 is minted for only when the router
        pins its rank.
        """
        if self.engine_id is None:
            return None
        if self.dp_size > 1:
            return None if self.dp_rank is None else f"{self.engine_id}_dp{self.dp_rank}"
        return self.engine_id

    @property
    def bootstrap_addr(self) -> str:
        """``http://host:port``, an IPv6 host in brackets and its zone as ``%25``
        ([`authority`][pd_policy.authority.authority]). Raises
        [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a host no URL
        can carry."""
        return f"http://{authority(self.bootstrap_host or '', self.bootstrap_port)}"


@attrs.frozen(slots=True)
class KvHandoff:
    """The KV handoff of one request, as data: what each leg carries about it.

    ``runs_prefill`` is false for n>1: the decode leg then runs alone.
    ``prefill_params`` tags the prefill leg (``None``: the leg keeps what it
    has). ``decode_params`` and ``decode_legacy`` go on the decode leg before
    prefill runs (a minted Mooncake transfer, or the legacy host and port).
    ``relays``: put the KV parameters the prefill returns on the decode leg.
    ``dp_rank`` is the data-parallel rank to pin the prefill leg to. ``mode`` is the
    contract planned for: the post-prefill check reads the fields it requires
    ([`ensure_kv_handoff`][pd_policy.handoff.ensure_kv_handoff]). ``lease``: the prefill's
    lease on the KV it hands over ([`PrefillKv`][pd_policy.connectors.PrefillKv]), which
    the decode leg must be sent within ([`check_kv_lease`][pd_policy.kv_lease.check_kv_lease]).
    """

    runs_prefill: bool
    prefill_params: str | None = attrs.field(default=None, repr=redacted_repr)
    decode_params: str | None = attrs.field(default=None, repr=redacted_repr)
    decode_legacy: LegacyKvParams | None = attrs.field(default=None, repr=redacted_repr)
    relays: bool = False
    transfer_id: str | None = attrs.field(default=None, repr=redacted_repr)
    dp_rank: int | None = None
    mode: KvConnectorMode = attrs.field(
        kw_only=True, validator=instance_of(KvConnectorMode, error=InvalidConfiguration)
    )
    lease: float | None = attrs.field(default=None, kw_only=True, validator=_check_lease)


def _json(params: dict[str, object]) -> str:
    return json.dumps(params, separators=(",", ":"))


def plan_kv_handoff(kv: PrefillKv, *, n: int, transfer_id: str | None = None) -> KvHandoff:
    """The handoff for a request asking for ``n`` samples (0 means 1), through ``kv``.

    ``transfer_id`` is the id a Mooncake transfer is minted with; ``None``
    mints a fresh one ([`mint_transfer_id`][pd_policy.connectors.mint_transfer_id]). Pure given
    ``transfer_id``.
    """
    legacy = None
    engine_id = kv.mooncake_engine_id if kv.mode is KvConnectorMode.MOONCAKE else None
    if kv.mode is KvConnectorMode.MOONCAKE and engine_id is None:
        assert kv.bootstrap_host is not None  # PrefillKv checks it
        legacy = LegacyKvParams(kv.bootstrap_host, kv.bootstrap_port)
    mode = kv.mode
    if n > 1:
        # One consumer per handoff: decode recomputes the prompt alone.
        return KvHandoff(runs_prefill=False, decode_legacy=legacy, mode=mode)
    if mode in (KvConnectorMode.NIXL, KvConnectorMode.NIXL_PUSH, KvConnectorMode.TRANSFER):
        return KvHandoff(
            runs_prefill=True,
            prefill_params=NIXL_PREFILL_PARAMS,
            relays=True,
            mode=mode,
            lease=kv.lease,
        )
    if mode is KvConnectorMode.PASSTHROUGH:
        return KvHandoff(runs_prefill=True, relays=True, mode=mode)
    if engine_id is None:
        return KvHandoff(runs_prefill=True, decode_legacy=legacy, mode=mode)
    tid = transfer_id if transfer_id is not None else mint_transfer_id()
    prefill = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid}
    decode = {
        "do_remote_decode": False,
        "do_remote_prefill": True,
        "transfer_id": tid,
        "remote_engine_id": engine_id,
        "remote_bootstrap_addr": kv.bootstrap_addr,
    }
    return KvHandoff(
        runs_prefill=True,
        prefill_params=_json(prefill),
        decode_params=_json(decode),
        transfer_id=tid,
        dp_rank=kv.dp_rank if kv.dp_size > 1 else None,
        mode=mode,
    )


def apply_kv_handoff(leg: Request, handoff: KvHandoff) -> Request:
    """The decode leg carrying what ``handoff`` puts on it before prefill.

    A minted transfer replaces any KV parameters the leg had; the legacy pair
    is set as the typed form. A leg the plan puts nothing on is returned as is.
    """
    changes: dict[str, object] = {}
    if handoff.decode_params is not None:
        changes["kv_transfer_params"] = handoff.decode_params
    if handoff.decode_legacy is not None:
        changes["kv_legacy"] = handoff.decode_legacy
    return leg._derive_trusted(**changes) if changes else leg


def mint_transfer_id(*, unix_ms: int | None = None, random: bytes | None = None) -> str:
    """A Mooncake transfer id: ``"xfer-"`` and a UUIDv7 (time-ordered, 74 random bits).

    ``unix_ms`` and ``random`` (10 bytes) default to the clock and the OS;
    tests pass them to get a fixed id.
    """
    ms = time.time_ns() // 1_000_000 if unix_ms is None else unix_ms
    rand = os.urandom(10) if random is None else random
    if len(rand) != 10:
        raise ValueError("random must be 10 bytes")
    value = (ms & (1 << 48) - 1) << 80
    value |= 0x7 << 76 | (int.from_bytes(rand[:2], "big") & 0x0FFF) << 64
    value |= 0b10 << 62 | int.from_bytes(rand[2:], "big") & (1 << 62) - 1
    return f"xfer-{uuid.UUID(int=value)}"

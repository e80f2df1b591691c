"""The prefill's lease on a request's KV: a decode leg is sent only while it holds.

A NIXL prefill (vLLM's ``NixlConnector``, pull or push) keeps a request's KV blocks for
the decode for ``kv_lease_duration`` seconds after it answers (30 by default; the
decode's heartbeats extend it once the decode has the request), then frees them. vLLM
0.32's pull decode reads the blocks by id whatever became of them: a handoff relayed
past the lease is read from freed blocks, without an error, and answered 200, from
whatever those blocks hold by then (the prefill only logs "Potentially invalid KV
blocks ... may have expired"). A push prefill that no decode registered with in time
has dropped the request, and its decode waits out ``decoder_kv_blocks_ttl`` (480 s).

So a router relays a leased handoff only while more than
[`lease_margin`][pd_policy.kv_lease.lease_margin] of the lease is left, counted from
when it sent the prefill leg (which is before the prefill's lease began, so the count
is never short). Past that, [`KvLeaseExpired`][pd_policy.kv_lease.KvLeaseExpired]: a
new attempt runs a new prefill.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from .connectors import KvConnectorMode
from .errors import PolicyError
from .wires import CONNECTORS, MULTI_CONNECTOR

__all__ = [
    "NIXL_LEASE",
    "SAFETY_MARGIN",
    "KvLeaseExpired",
    "check_kv_lease",
    "lease_margin",
    "prefill_lease",
]

#: vLLM's ``kv_lease_duration`` when a NIXL prefill's ``kv_connector_extra_config`` sets none.
NIXL_LEASE: Final = 30.0
#: The seconds of a lease a decode leg needs left when it is sent: vLLM's own margin for a
#: decode's read of blocks about to expire (``_KV_BLOCKS_EXPIRY_SAFETY_MARGIN``), time for
#: the decode to take the leg and start its read or its heartbeats.
SAFETY_MARGIN: Final = 5.0


class KvLeaseExpired(PolicyError):
    """The prefill's answer came too late: its lease on the request's KV has run out, or
    would before the decode could read it."""

    code = "pd_kv_lease_expired"
    status = 502
    may_retry = True
    meaning = (
        "The prefill worker's KV connector (NIXL) holds a request's KV for a lease "
        "(kv_lease_duration, 30 s by default) after it answers, and the decode leg could not "
        "be sent with enough of it left (5 s, or half a shorter lease), counted from when "
        "the prefill leg was sent. A decode that read the handoff now would read freed "
        "blocks and answer 200 from whatever they hold (vLLM 0.32 reads them without an "
        "error). Refused before the decode leg; a new attempt runs a new prefill."
    )
    default_message = (
        "the prefill's answer came after its lease on the request's KV ran out (or too close "
        "to it for the decode to read the KV): the handoff was not relayed"
    )


def lease_margin(lease: float) -> float:
    """The seconds of a ``lease`` a decode leg needs left when it is sent:
    [`SAFETY_MARGIN`][pd_policy.kv_lease.SAFETY_MARGIN], or half of a lease shorter than
    twice that."""
    return min(SAFETY_MARGIN, lease / 2)


def check_kv_lease(lease: float | None, age: float) -> None:
    """Refuse to relay a handoff ``age`` seconds old (since its prefill leg was sent) under
    a prefill lease of ``lease`` seconds (``None``: the prefill holds KV without a lease)
    once no more than [`lease_margin`][pd_policy.kv_lease.lease_margin] of it is left.

    Raises [`KvLeaseExpired`][pd_policy.kv_lease.KvLeaseExpired] (502, retryable).
    """
    if lease is None:
        return
    if not math.isfinite(age) or age >= lease - lease_margin(lease):
        raise KvLeaseExpired()


_LEASED: Final = frozenset({KvConnectorMode.NIXL, KvConnectorMode.NIXL_PUSH})


def _extra(config: Mapping[str, Any]) -> Mapping[str, Any]:
    extra = config.get("kv_connector_extra_config")
    return extra if isinstance(extra, Mapping) else {}


def prefill_lease(kv_transfer_config: Mapping[str, Any], mode: KvConnectorMode) -> Any:
    """The lease of a prefill worker whose handoff contract is ``mode`` and whose
    ``kv_transfer_config`` (vLLM's JSON; ``{}`` when it does not describe itself) is this:
    for NIXL (pull or push), its NIXL connector's ``kv_lease_duration`` (that of the NIXL
    connector among a ``MultiConnector``'s), else vLLM's default,
    [`NIXL_LEASE`][pd_policy.kv_lease.NIXL_LEASE]; ``None`` for the other contracts. The
    value is returned as the config holds it: [`PrefillKv`][pd_policy.connectors.PrefillKv]
    refuses one that is not a positive number."""
    if mode not in _LEASED:
        return None
    configs = [kv_transfer_config]
    if kv_transfer_config.get("kv_connector") == MULTI_CONNECTOR:
        children = _extra(kv_transfer_config).get("connectors")
        configs += (
            [c for c in children if isinstance(c, Mapping)] if isinstance(children, list) else []
        )
    for config in configs:
        name = config.get("kv_connector")
        wire = CONNECTORS.get(name) if isinstance(name, str) else None
        if wire is not None and wire.mode in _LEASED:
            return _extra(config).get("kv_lease_duration", NIXL_LEASE)
    return NIXL_LEASE

"""Every vLLM KV connector, served with a handoff contract or refused with a reason.

vLLM names a worker's connector in its ``kv_transfer_config`` (SMG's servicer
reports the name as ``GetServerInfoResponse.kv_connector``).
[`CONNECTORS`][pd_policy.wires.CONNECTORS] is the one table of them: each is either
*served*, with the contract its prefill follows
([`KvConnectorMode`][pd_policy.connectors.KvConnectorMode]) and how a decode running
it loads the prefill's KV ([`KvLoad`][pd_policy.decode_kv.KvLoad]), or *refused*,
with why. A name the table does not hold is refused too: guessing would either tag
a prefill its connector ignores or leave untagged one that needs it.

Two rules need more than the name, and read the whole ``kv_transfer_config``
([`handoff_mode`][pd_policy.wires.handoff_mode],
[`decode_kv_from_config`][pd_policy.wires.decode_kv_from_config]):

* a ``MultiConnector`` follows its connectors: the one handoff among them, beside
  any number that only cache; two handoffs, or none, are refused;
* an ``OffloadingConnector`` with a ``p2p`` secondary tier is refused: that tier needs
  a minted ``kv_request_id`` and the prefill's P2P address on both legs, and its
  decode matches blocks by content hash.

Pure: stdlib and attrs.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

from .connectors import KvConnectorMode
from .decode_kv import DecodeKv, KvLoad, LoadFailure
from .errors import InvalidConfiguration
from .wire_errors import LegRoutesDiffer

__all__ = [
    "CONNECTORS",
    "CONNECTOR_MODES",
    "MULTI_CONNECTOR",
    "Wire",
    "check_leg_routes",
    "connector_mode",
    "decode_kv_from_config",
    "handoff_mode",
]

#: The connector that composes others (``kv_connector_extra_config.connectors``).
MULTI_CONNECTOR: Final = "MultiConnector"


@attrs.frozen(slots=True)
class Wire:
    """One connector: ``mode`` is the contract it is served with (``None``: refused,
    ``why`` says why), ``loads`` how a decode running it finds the prefill's KV.
    ``beside_a_handoff``: it may sit in a ``MultiConnector`` beside a connector that
    hands KV over (it only caches, or moves nothing between engines)."""

    mode: KvConnectorMode | None
    loads: KvLoad
    why: str = ""
    beside_a_handoff: bool = True


def _served(mode: KvConnectorMode, loads: KvLoad = KvLoad.BY_REQUEST) -> Wire:
    return Wire(mode, loads)


_NIXL, _PASS = KvConnectorMode.NIXL, KvConnectorMode.PASSTHROUGH
_CONTENT = KvLoad.BY_CONTENT
_LOCAL = "not a P/D handoff: "

#: Every connector name, served or refused. ``""`` is a worker with no connector:
#: nothing to tag, nothing comes back, and its decode loads nothing.
CONNECTORS: Final[Mapping[str, Wire]] = MappingProxyType(
    {
        "NixlConnector": _served(_NIXL),
        "NixlPullConnector": _served(_NIXL),
        "NixlPushConnector": _served(KvConnectorMode.NIXL_PUSH),
        # pd-policy's own CPU connector: tagged and relayed as NIXL is, named by a transfer id.
        "TransferConnector": _served(KvConnectorMode.TRANSFER),
        "MooncakeConnector": _served(KvConnectorMode.MOONCAKE),
        # Stores and offloading tiers return no parameters: they load by content hash.
        "ExampleConnector": _served(_PASS, _CONTENT),
        "SharedStorageConnector": _served(_PASS, _CONTENT),  # ExampleConnector, before 0.11
        "LMCacheConnectorV1": _served(_PASS, _CONTENT),
        "LMCacheMPConnector": _served(_PASS, _CONTENT),
        "MooncakeStoreConnector": _served(_PASS, _CONTENT),
        "OffloadingConnector": _served(_PASS, _CONTENT),  # its p2p tier: refused by config
        "": _served(_PASS, KvLoad.NONE),
        MULTI_CONNECTOR: Wire(
            None,
            KvLoad.UNKNOWN,
            "its contract is its connectors' (kv_connector_extra_config.connectors), which "
            "the worker's name alone does not say: pass the handoff mode",
        ),
        "SimpleCPUOffloadConnector": Wire(
            None, KvLoad.NONE, _LOCAL + "it offloads KV to its own engine's CPU memory"
        ),
        "HiSparseConnector": Wire(
            None, KvLoad.NONE, _LOCAL + "it offloads a sparse-attention model's KV in its engine"
        ),
        "ExampleHiddenStatesConnector": Wire(
            None, KvLoad.NONE, _LOCAL + "it writes hidden states for speculative decoding"
        ),
        "DecodeBenchConnector": Wire(
            None,
            KvLoad.NONE,
            "it fills a decode's KV with dummy values, for benchmarks: every answer is noise",
            beside_a_handoff=False,
        ),
        "MoRIIOConnector": Wire(
            None,
            KvLoad.BY_REQUEST,
            "it needs each leg's peer named up front (a ZMQ address in the request id, or "
            "the decode's host and ports on the prefill leg), which pd-policy does not send",
            beside_a_handoff=False,
        ),
        "HF3FSKVConnector": Wire(
            None,
            _CONTENT,
            "it keys blocks by token ids alone, without the media's identifiers or the "
            "cache_salt: two images of one size share keys, and a decode loads the wrong one",
            beside_a_handoff=False,
        ),
        "FlexKVConnectorV1": Wire(
            None,
            _CONTENT,
            "its block keys are made in the flexkv package, outside vLLM: whether they hold "
            "the media's identifiers and the cache_salt is unknown",
            beside_a_handoff=False,
        ),
    }
)

#: The served connectors and their contract: [`CONNECTORS`][pd_policy.wires.CONNECTORS]'
#: served rows.
CONNECTOR_MODES: Final[Mapping[str, KvConnectorMode]] = MappingProxyType(
    {name: wire.mode for name, wire in CONNECTORS.items() if wire.mode is not None}
)


def _refusal(name: str, why: str) -> InvalidConfiguration:
    return InvalidConfiguration(f"KV connector {name[:64]!r} is refused: {why}", "kv_connector")


def _wire(name: str) -> Wire:
    wire = CONNECTORS.get(name)
    if wire is None:
        raise InvalidConfiguration(
            f"unknown KV connector {name[:64]!r}: pass its handoff mode (nixl, nixl_push, "
            "transfer, mooncake or passthrough) explicitly",
            param="kv_connector",
        )
    return wire


def connector_mode(kv_connector: str) -> KvConnectorMode:
    """The handoff contract of the connector class named ``kv_connector``, matched
    exactly as vLLM registers it.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a refused
    connector (the message says why) and for a name the table does not hold. Name the
    mode explicitly for a connector this library does not know.
    """
    wire = _wire(kv_connector)
    if wire.mode is None:
        raise _refusal(kv_connector, wire.why)
    return wire.mode


def _section(config: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = config.get(key)
    return value if isinstance(value, Mapping) else {}


def _name(config: Mapping[str, Any]) -> str:
    name = config.get("kv_connector") or ""
    if not isinstance(name, str):
        raise InvalidConfiguration("kv_connector must be a string", "kv_connector")
    return name


def _children(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    children = _section(config, "kv_connector_extra_config").get("connectors")
    if not isinstance(children, list) or not all(isinstance(c, Mapping) for c in children):
        raise InvalidConfiguration(
            "a MultiConnector's kv_connector_extra_config.connectors must be a list of "
            "connector configs",
            "kv_connector",
        )
    return children


def _p2p_tier(config: Mapping[str, Any]) -> bool:
    tiers = _section(config, "kv_connector_extra_config").get("secondary_tiers")
    return isinstance(tiers, list) and any(
        isinstance(t, Mapping) and t.get("type") == "p2p" for t in tiers
    )


_P2P: Final = (
    "its p2p secondary tier needs a minted kv_request_id and the prefill's P2P address on "
    "both legs, which pd-policy does not send, and its decode matches blocks by content hash"
)


_NESTED: Final = Wire(
    None, KvLoad.UNKNOWN, "a MultiConnector inside a MultiConnector", beside_a_handoff=False
)


def _own_mode(config: Mapping[str, Any], *, nested: bool = False) -> KvConnectorMode | None:
    # A connector's mode (None: one that may only sit beside a handoff), or its refusal.
    name = _name(config)
    if name == MULTI_CONNECTOR and not nested:
        return _multi_mode(config)
    wire = _wire(name) if name != MULTI_CONNECTOR else _NESTED
    if wire.mode is KvConnectorMode.PASSTHROUGH and _p2p_tier(config):
        raise _refusal(name, _P2P)
    if wire.mode is None and not (nested and wire.beside_a_handoff):
        raise _refusal(name, wire.why)
    return wire.mode


def _multi_mode(config: Mapping[str, Any]) -> KvConnectorMode:
    modes = {m for c in _children(config) if (m := _own_mode(c, nested=True)) is not None}
    handoffs = modes - {KvConnectorMode.PASSTHROUGH}
    if len(handoffs) > 1:
        raise _refusal(MULTI_CONNECTOR, "it holds two handoffs, and a decode takes one")
    if not modes:
        raise _refusal(MULTI_CONNECTOR, _LOCAL + "none of its connectors hands KV over")
    return handoffs.pop() if handoffs else KvConnectorMode.PASSTHROUGH


def handoff_mode(
    kv_transfer_config: Mapping[str, Any], *, stated: KvConnectorMode | None = None
) -> KvConnectorMode:
    """The contract of a prefill worker whose ``kv_transfer_config`` (vLLM's JSON) is
    this; ``{}`` is a worker without a connector (``PASSTHROUGH``).

    ``stated`` is the operator's mode, which wins (for a connector this library does
    not know), except that a worker described as ``NixlPushConnector`` stated ``nixl``
    stays ``nixl_push``: the two differ only in the route rule, a fact of the worker.
    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a refused
    or unknown connector, naming why, and for a config of the wrong shape.
    """
    if stated is not None:
        push = KvConnectorMode.NIXL_PUSH
        names = {_name(kv_transfer_config)}
        if _name(kv_transfer_config) == MULTI_CONNECTOR:
            names |= {_name(c) for c in _children(kv_transfer_config)}
        pushes = any(CONNECTORS.get(n, Wire(None, KvLoad.UNKNOWN)).mode is push for n in names)
        return push if stated is KvConnectorMode.NIXL and pushes else stated
    mode = _own_mode(kv_transfer_config)
    assert mode is not None  # a top-level connector that only caches is refused
    return mode


def _loads(config: Mapping[str, Any]) -> KvLoad:
    name = config.get("kv_connector") or ""
    if not isinstance(name, str):
        return KvLoad.UNKNOWN
    if name != MULTI_CONNECTOR:
        wire = CONNECTORS.get(name)
        return wire.loads if wire is not None else KvLoad.UNKNOWN
    children = _section(config, "kv_connector_extra_config").get("connectors")
    if not isinstance(children, list):
        return KvLoad.UNKNOWN
    # vLLM asks each in turn and loads from the first with a hit: one that loads the
    # named transfer always has one for a handed-over leg.
    loads = {_loads(c) if isinstance(c, Mapping) else KvLoad.UNKNOWN for c in children}
    for kind in (KvLoad.BY_REQUEST, KvLoad.UNKNOWN, KvLoad.BY_CONTENT):
        if kind in loads:
            return kind
    return KvLoad.NONE


def decode_kv_from_config(kv_transfer_config: Mapping[str, Any] | None) -> DecodeKv:
    """How a decode worker whose ``kv_transfer_config`` is this takes KV (``None``: it
    has none: it loads nothing). The load comes from the table (a ``MultiConnector``:
    ``BY_REQUEST`` when one of its connectors loads the named transfer); the failure
    policy is ``kv_load_failure_policy``, vLLM's default ``"fail"`` when absent. A
    connector the table does not hold loads ``UNKNOWN``. Never raises: a decode is
    described, not refused."""
    config = kv_transfer_config if isinstance(kv_transfer_config, Mapping) else {}
    policy = config.get("kv_load_failure_policy", "fail")
    on_failure = LoadFailure.RECOMPUTE if policy == "recompute" else LoadFailure.FAIL
    if policy not in ("fail", "recompute"):
        on_failure = LoadFailure.UNKNOWN
    return DecodeKv(_loads(config), on_failure)


def check_leg_routes(mode: KvConnectorMode, prefill_route: str, decode_route: str) -> None:
    """Refuse legs that go to two routes under a contract that pairs them by route
    ([`legs_share_route`][pd_policy.connectors.KvConnectorMode.legs_share_route]), with
    [`LegRoutesDiffer`][pd_policy.wire_errors.LegRoutesDiffer] (400, non-retryable),
    before any leg is sent. Routes are paths (``/v1/chat/completions``)."""
    if mode.legs_share_route and prefill_route != decode_route:
        raise LegRoutesDiffer(
            f"the prefill leg would go to {prefill_route[:64]} and the decode leg to "
            f"{decode_route[:64]}, and the prefill's KV connector (NIXL push) pairs them by "
            "request id and route: the decode would never be matched. Use "
            "/v1/chat/completions or /v1/completions, or a pull connector (NixlConnector)"
        )

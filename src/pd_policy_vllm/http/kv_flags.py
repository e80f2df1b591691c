"""The flags of KV-event routing (``docs/routing.md``), and the routing they ask for."""

from __future__ import annotations

import argparse

from pd_policy import InvalidConfiguration
from pd_policy_vllm.http.fleet.kv_routing import KvRouting

__all__ = ["add_kv_routing_flags", "kv_routing"]


def add_kv_routing_flags(group: argparse._ArgumentGroup) -> None:
    """Add KV-event routing's flags to ``group``."""
    add = group.add_argument
    add(
        "--kv-routing",
        action="store_true",
        help="send each request to the prefill whose KV cache holds the most of it, within "
        "the load bound, as the prefills' KV events say (each run with --kv-events-config "
        "on tcp://*:PORT, described by its /server_info or the file; chat requests are "
        "rendered on one with --enable-scale-out); a prefill whose events cannot be "
        "followed is routed as before",
    )
    add(
        "--kv-hash-seed",
        metavar="SEED",
        help="the prefills' PYTHONHASHSEED, when they run with one (it seeds their block hashes)",
    )
    add(
        "--kv-index-blocks",
        type=int,
        default=1 << 20,
        help="the block hashes kept per prefill for KV routing (1048576: 8 MiB or so each)",
    )
    add(
        "--no-render-once",
        dest="render_once",
        action="store_false",
        help="with --kv-routing, send the prefill the client's body even when the lookup "
        "rendered it (by default its prefill leg is token-in from that render, to the "
        "prefill's /inference/v1/generate, where the connector allows)",
    )


def kv_routing(args: argparse.Namespace) -> KvRouting | None:
    """The KV-event routing the flags ask for, if any. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a bound below 1."""
    if not args.kv_routing:
        return None
    if args.kv_index_blocks < 1:
        raise InvalidConfiguration("--kv-index-blocks must be at least 1", "kv_index_blocks")
    return KvRouting(seed=args.kv_hash_seed, max_blocks=args.kv_index_blocks)

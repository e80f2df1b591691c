"""The command line of ``pd-policy-proxy``: what each flag means, and its default.

Workers are named by URL, IPv6 literals in brackets (``http://[::1]:8100``). Keys never
come from a flag that ``ps`` would show ([`auth`][pd_policy_vllm.http.auth]) but
``--admin-api-key``, as other gateways spell it (its file and ``$PD_POLICY_ADMIN_API_KEYS``
keep it out of ``ps``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Final

from pd_policy import Balance, ClientUuids, KvConnectorMode, __version__
from pd_policy.wires import decode_kv_from_config
from pd_policy_vllm.http.config.values import bind_host, json_object, seconds
from pd_policy_vllm.http.fleet.allowed_hosts import AllowedHosts, allowed_hosts
from pd_policy_vllm.http.fleet.describe import CAPABILITIES, OperatorSays
from pd_policy_vllm.http.kv_flags import add_kv_routing_flags, kv_routing
from pd_policy_vllm.http.lifecycle import DRAIN_SECONDS, PRE_STOP_SECONDS
from pd_policy_vllm.http.limit_flags import (
    add_client_limit_flags,
    add_media_limit_flags,
    add_worker_limit_flags,
    front_door,
    media_limits,
    upstream_limits,
)
from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.observe_flags import add_observe_flags

__all__ = [
    "GROUPS",
    "admin_hosts",
    "client_uuids",
    "front_door",
    "kv_routing",
    "media_limits",
    "operator_says",
    "parser",
    "upstream_limits",
]


#: The groups of ``--help``, in its order: each setting is in one.
GROUPS: Final = (
    "general",
    "workers",
    "listening",
    "routing",
    "KV routing",
    "media",
    "keys and admin",
    "limits on clients",
    "limits on workers",
    "logs, metrics and traces",
)


def parser() -> argparse.ArgumentParser:
    """The command line of ``pd-policy-proxy``: every setting's flag, in ``--help``'s
    groups; each also a key of ``--config``'s file and an environment variable
    ([`config`][pd_policy_vllm.http.config])."""
    cli = argparse.ArgumentParser(
        prog="pd-policy-proxy",
        description="A P/D proxy in front of vllm serve workers. Every setting is a flag, "
        "a key of the --config file and a PD_POLICY_<KEY> environment variable; a flag "
        "wins over the environment, which wins over the file.",
    )
    group = {title: cli.add_argument_group(title) for title in GROUPS}
    add = group["general"].add_argument
    add("--version", action="version", version=f"%(prog)s {__version__}")
    add(
        "--config",
        type=Path,
        metavar="PATH",
        help="a TOML file of settings and [[workers]] (also $PD_POLICY_CONFIG)",
    )
    add(
        "--config-watch-seconds",
        type=seconds,
        default=5.0,
        help="seconds between checks of the --config file and the keys files it names; "
        "one that changed is read again, as on SIGHUP (5; 0: on SIGHUP only)",
    )
    add(
        "--print-config",
        action="store_true",
        help="print the effective configuration, secrets hidden, and exit",
    )
    add_observe_flags(group["logs, metrics and traces"])
    add = group["workers"].add_argument
    add("--prefill", action="append", default=[], help="a prefill worker's URL (repeat)")
    add("--decode", action="append", default=[], help="a decode worker's URL (repeat)")
    add(
        "--encode",
        action="append",
        default=[],
        help="an encoder-only worker's URL (ec_producer; repeat): E/P/D for media",
    )
    mrope = group["workers"].add_mutually_exclusive_group()
    mrope.add_argument("--mrope", action="store_true", default=None, help="the model uses M-RoPE")
    mrope.add_argument("--no-mrope", dest="mrope", action="store_false", help="it does not")
    add(
        "--kv-mode",
        choices=[m.value for m in KvConnectorMode],
        help="the prefills' handoff contract, when their servers do not say (or override)",
    )
    add("--bootstrap-port", type=int, help="the Mooncake bootstrap port (8998)")
    add(
        "--decode-capability",
        choices=sorted(CAPABILITIES),
        help="the capability of a decode worker that does not describe itself (none: it is "
        "taken as lm-only, and sent no media)",
    )
    add(
        "--decode-kv-transfer-config",
        type=json_object,
        metavar="JSON",
        help="the --kv-transfer-config of a decode worker that does not describe itself: "
        "its connector and kv_load_failure_policy say whether it may take a multimodal "
        "leg without its media",
    )
    add("--startup-timeout", type=float, default=120.0, help="seconds to wait for the workers")
    add(
        "--dns-server",
        metavar="HOST:PORT",
        help="the DNS server the file's [[discover]] names are resolved with (the system's "
        "resolver)",
    )
    add = group["listening"].add_argument
    add(
        "--host",
        type=bind_host,
        default="127.0.0.1",
        help="address to bind (127.0.0.1; ::1 or [::1] for IPv6)",
    )
    add("--port", type=int, default=8000, help="port to bind (8000)")
    add(
        "--processes",
        type=int,
        default=1,
        help="proxy processes sharing the port (SO_REUSEPORT), each with its own state",
    )
    add(
        "--pre-stop-seconds",
        type=seconds,
        default=PRE_STOP_SECONDS,
        help="after SIGTERM, seconds new requests are still served while /ready answers "
        f"503 and a balancer takes the proxy out ({PRE_STOP_SECONDS:g})",
    )
    add(
        "--drain-seconds",
        type=seconds,
        default=DRAIN_SECONDS,
        help="then, seconds the requests in flight have to finish before they are cut "
        f"({DRAIN_SECONDS:g}; with the pre-stop, within Kubernetes' 30 s grace)",
    )
    add(
        "--no-access-log",
        dest="access_log",
        action="store_false",
        help="log no requests: neither the access log nor the one JSON line a request",
    )
    add = group["routing"].add_argument
    add(
        "--attempts",
        type=int,
        default=2,
        help="attempts per request in all: a worker's failure before any byte reached the "
        "client is tried again on other workers (2)",
    )
    add(
        "--probe-interval",
        type=float,
        default=2.0,
        help="seconds between health probes of every worker (0: no probes) (2)",
    )
    add(
        "--balance",
        choices=[b.value for b in Balance],
        default=Balance.LEAST_OUTSTANDING.value,
        help="how load is balanced among equally good workers",
    )
    add(
        "--affinity-bound",
        type=float,
        default=1.25,
        help="a worker takes its media's requests until it holds this x the mean (1.25)",
    )
    add_kv_routing_flags(group["KV routing"])
    add = group["media"].add_argument
    add(
        "--remote-media",
        choices=[m.value for m in RemoteMedia],
        help="what to do with a remote media URL: fetch it once for every leg (the default "
        "when the prefill describes its media rules), leave it uncached (the default "
        "otherwise), or refuse it",
    )
    add(
        "--allowed-media-domains",
        nargs="*",
        metavar="HOST",
        help="the workers' --allowed-media-domains, when their servers do not say (none: any "
        "host); with it the proxy may fetch remote media for them",
    )
    add(
        "--trust-client-uuids",
        action="store_true",
        help="forward a client's media uuid as sent, as vLLM takes it: every client's uuids "
        "then share one namespace, and one tenant's uuid can name another's image (default: "
        "each uuid is scoped to its tenant, the request's cache_salt and API key)",
    )
    add_media_limit_flags(group["media"])
    add = group["keys and admin"].add_argument
    add(
        "--worker-api-key-file",
        type=Path,
        help="a file holding the workers' API key (else $PD_POLICY_WORKER_API_KEY)",
    )
    add(
        "--api-keys-file",
        type=Path,
        help="a file of the keys clients may call with, one a line (else $PD_POLICY_API_KEYS;"
        " none: any client)",
    )
    add(
        "--admin",
        action="store_true",
        help="serve /admin/workers: list, add and drain workers at run time, to an admin "
        "key only (one is required)",
    )
    add(
        "--admin-api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a key that admits /admin/* (repeat; also $PD_POLICY_ADMIN_API_KEYS, "
        "comma-separated): never a client's, and it admits no /v1 route unless also one. "
        "A flag shows in ps: prefer the environment or --admin-api-keys-file",
    )
    add(
        "--admin-api-keys-file",
        type=Path,
        help="a file of admin keys, one a line (else $PD_POLICY_ADMIN_API_KEYS)",
    )
    add(
        "--admin-allowed-hosts",
        action="append",
        metavar="HOSTS",
        help="the hosts an admin may add a worker on: names, addresses and CIDR networks "
        "(repeat, or comma-separated; a network matches address literals only) (any)",
    )
    add_client_limit_flags(group["limits on clients"])
    add_worker_limit_flags(group["limits on workers"])
    return cli


def operator_says(args: argparse.Namespace) -> OperatorSays:
    """What the flags say of workers that do not describe themselves."""
    domains, config = args.allowed_media_domains, args.decode_kv_transfer_config
    return OperatorSays(
        kv_mode=KvConnectorMode(args.kv_mode) if args.kv_mode else None,
        bootstrap_port=args.bootstrap_port,
        capability=CAPABILITIES[args.decode_capability] if args.decode_capability else None,
        allowed_media_domains=tuple(domains) if domains is not None else None,
        decode_kv=decode_kv_from_config(config) if config is not None else None,
    )


def admin_hosts(args: argparse.Namespace) -> AllowedHosts | None:
    """The hosts an admin may add a worker on; ``None``: any. Raises
    [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for an entry that is
    not a host, an address or a network."""
    return allowed_hosts(args.admin_allowed_hosts) if args.admin_allowed_hosts else None


def client_uuids(args: argparse.Namespace) -> ClientUuids:
    """What the flags say a client's media uuid is forwarded as: scoped to its tenant
    unless ``--trust-client-uuids``."""
    return ClientUuids.TRUSTED if args.trust_client_uuids else ClientUuids.SCOPED

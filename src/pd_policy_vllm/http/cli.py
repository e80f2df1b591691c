"""``pd-policy-proxy``: run the P/D proxy in front of a fleet of ``vllm serve`` workers.

    pd-policy-proxy [--config FILE] [--prefill URL ...] [--decode URL ...]
                    [--encode URL ...] [--mrope | --no-mrope] [--processes N]
                    [--admin [--admin-allowed-hosts HOSTS]]

Every setting is also a key of the ``--config`` file and an environment variable
([`config`][pd_policy_vllm.http.config]). Each worker is described by the file's
``[[workers]]`` table, the flags, or its own ``/server_info`` (``VLLM_SERVER_DEV_MODE=1``);
a decode nothing describes is language-model-only, and then ``--mrope`` or
``--no-mrope`` is required. It probes every worker (``--probe-interval``), ejects one
that fails and re-admits it, described anew. It binds to 127.0.0.1 by default, drains
on SIGTERM ([`serving`][pd_policy_vllm.http.serving]), and exits 2 for a configuration
it cannot serve (``--admin`` without an admin key among them: ``/admin/*`` is never
open, nor the clients').
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from collections.abc import Sequence

import attrs

from pd_policy import (
    Balance,
    EncoderCacheRole,
    HealthPolicy,
    InvalidConfiguration,
)
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.auth import Keys, read_keys
from pd_policy_vllm.http.config.load import configuration
from pd_policy_vllm.http.flags import (
    admin_hosts,
    client_uuids,
    front_door,
    kv_routing,
    media_limits,
    operator_says,
    parser,
    upstream_limits,
)
from pd_policy_vllm.http.fleet.allowed_hosts import AllowedHosts
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.discovery import Discovery
from pd_policy_vllm.http.fleet.members import Fleet, member_name
from pd_policy_vllm.http.fleet.probe import Probe
from pd_policy_vllm.http.fleet.routing import decode_capability
from pd_policy_vllm.http.log_filter import install as redact_logs
from pd_policy_vllm.http.log_format import configure as configure_logging
from pd_policy_vllm.http.media.fetch import RemoteMedia
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.serving import processes, serve
from pd_policy_vllm.http.tracing import check as check_tracing
from pd_policy_vllm.http.tracing import otlp_tracing
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = [
    "configuration",
    "discovery_of",
    "main",
    "parser",
    "probe_of",
    "read_encoder",
    "read_fleet",
    "read_workers",
    "stated_workers",
]

logger = logging.getLogger("pd_policy_vllm.http")


async def _described(
    session: aiohttp.ClientSession,
    url: str,
    role: str,
    says: OperatorSays,
    keys: Keys,
    deadline: float,
) -> HttpWorker:
    # A worker still starting refuses connections: wait for it, up to the deadline.
    while True:
        try:
            return await describe(session, url, role, says, keys.worker_headers())
        except aiohttp.ClientConnectionError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


def _check_epd(fleet: Fleet) -> None:
    # A prefill that misses its encoder cache kills its engine: refuse the fleet up front.
    encoders = fleet.of("encode")
    if not encoders:
        return
    producer, consumer = EncoderCacheRole.PRODUCER, EncoderCacheRole.CONSUMER
    for member in encoders:
        if member.worker.capability.encoder_cache is EncoderCacheRole.UNKNOWN:
            member.worker = attrs.evolve(  # the flag says what it is
                member.worker,
                capability=attrs.evolve(member.worker.capability, encoder_cache=producer),
            )
    checks = [("encode", m, m.worker.capability.encoder_cache is producer) for m in encoders]
    checks += [
        ("prefill", m, m.worker.capability.encoder_cache in (consumer, EncoderCacheRole.UNKNOWN))
        for m in fleet.of("prefill")
    ]
    for param, member, role_ok in checks:
        if not (role_ok and member.worker.renders):
            raise InvalidConfiguration(
                "E/P/D needs encoder-only workers (ec_producer) serving --enable-scale-out "
                "and prefill workers that consume their cache (ec_consumer) serving it too",
                param=param,
            )


async def read_fleet(args: argparse.Namespace, keys: Keys | None = None) -> Fleet:
    """Every worker of the flags, described by its server (or by the flags), in service.

    Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for a fleet
    this proxy cannot serve (a prefill whose KV connector nothing names, an E/P/D fleet
    whose roles do not fit), and ``aiohttp.ClientError`` for a worker still unreachable
    after ``--startup-timeout``.
    """
    keys = keys if keys is not None else Keys()
    says = operator_says(args)
    deadline = time.monotonic() + args.startup_timeout
    fleet = Fleet(policy=HealthPolicy(), balance=Balance(args.balance), bound=args.affinity_bound)
    flagged = (("prefill", args.prefill), ("decode", args.decode), ("encode", args.encode))
    listed = [(role, url, says) for role, urls in flagged for url in urls]
    listed += [(role, url, said) for (role, url), said in stated_workers(args).items()]
    async with aiohttp.ClientSession() as session:
        for role, url, said in listed:
            worker = await _described(session, url, role, said, keys, deadline)
            fleet.add(role, worker)
    _check_epd(fleet)
    return fleet


def stated_workers(args: argparse.Namespace) -> dict[tuple[str, str], OperatorSays]:
    """What the configuration file says of each of its workers, by role and URL."""
    says = operator_says(args)
    return {(e.role, e.url): e.says(says) for e in getattr(args, "workers", ())}


def discovery_of(args: argparse.Namespace) -> Discovery | None:
    """The names ``args``'s file has the proxy follow in DNS, if any."""
    discover = getattr(args, "discover", ())
    if not discover:
        return None
    says = operator_says(args)
    return Discovery(tuple(d.source(says) for d in discover), args.dns_server)


def probe_of(args: argparse.Namespace) -> Probe:
    """How the fleet of ``args`` is probed, each worker described again as the flags or
    its own table of the configuration file describe it."""
    stated = {(role, member_name(url)): said for (role, url), said in stated_workers(args).items()}
    return Probe(interval=args.probe_interval, says=operator_says(args), stated=stated)


async def read_workers(args: argparse.Namespace) -> tuple[HttpWorker, list[HttpWorker]]:
    """The first prefill and the decode workers, as the proxy serves them behind that
    prefill: a decode worker takes M-RoPE metadata only where both serve vLLM's
    scale-out routes. Raises as [`read_fleet`][pd_policy_vllm.http.cli.read_fleet]."""
    fleet = await read_fleet(args)
    prefill = fleet.of("prefill")[0]
    decodes = [attrs.evolve(m.worker, capability=decode_capability(m)) for m in fleet.of("decode")]
    return prefill.worker, decodes


async def read_encoder(args: argparse.Namespace, prefill: HttpWorker) -> HttpWorker | None:
    """The first encoder-only worker of ``--encode``, for E/P/D; ``None`` without one.
    Raises as [`read_fleet`][pd_policy_vllm.http.cli.read_fleet] for a fleet whose roles
    do not fit."""
    if not args.encode:
        return None
    fleet = await read_fleet(args)
    return fleet.of("encode")[0].worker


def _members(fleet: Fleet) -> None:
    for member in fleet:
        capability = member.worker.capability
        logger.info(
            "%s %s: lm_only=%s metadata=%s scale_out=%s",
            member.role,
            member.name,
            capability.language_model_only,
            capability.takes_mm_metadata,
            member.worker.renders,
        )


def _admin(args: argparse.Namespace) -> tuple[Keys, AllowedHosts | None]:
    # Decided before any worker is waited for: a proxy that cannot start says so at once.
    keys = read_keys(
        worker_key_file=args.worker_api_key_file,
        client_keys_file=args.api_keys_file,
        admin_keys=args.admin_api_key,
        admin_keys_file=args.admin_api_keys_file,
    )
    if args.admin and not keys.admins:
        raise InvalidConfiguration(
            "--admin needs an admin key: --admin-api-key, --admin-api-keys-file or "
            "$PD_POLICY_ADMIN_API_KEYS (a client's key never admits /admin)",
            param="admin_api_key",
        )
    if args.admin and args.processes > 1:
        raise InvalidConfiguration(
            "--admin with --processes above 1: an admin change would reach one process of "
            "them; run one process (and more replicas) to change the fleet at run time",
            param="admin",
        )
    hosts = admin_hosts(args)
    if hosts is not None and not args.admin:
        raise InvalidConfiguration(
            "--admin-allowed-hosts bounds --admin, which is not set", param="admin_allowed_hosts"
        )
    return keys, hosts


def _configured(
    args: argparse.Namespace,
) -> tuple[Fleet, Keys, RemoteMedia | None, AllowedHosts | None]:
    keys, hosts = _admin(args)
    redact_logs(keys)  # before any worker is called: what it says may be logged
    fleet = asyncio.run(read_fleet(args, keys))
    remote = RemoteMedia(args.remote_media) if args.remote_media else None
    unknown = [m for m in fleet.of("prefill") if not m.worker.media.rules.known]
    if remote is RemoteMedia.FETCH and unknown:
        raise InvalidConfiguration(
            "--remote-media fetch needs every prefill worker's media rules: state its "
            "allowed_media_domains in the configuration file, pass --allowed-media-domains, "
            "or run it with VLLM_SERVER_DEV_MODE=1",
            param="remote_media",
        )
    lm_only = any(m.worker.capability.language_model_only for m in fleet.of("decode"))
    found = getattr(args, "discover", ())  # DNS's decodes: language-model-only unless said
    lm_only |= any(d.role == "decode" and d.entry.capability != "vision" for d in found)
    if args.mrope is None and lm_only:
        raise InvalidConfiguration(
            "a decode worker is language-model-only and no worker says whether the model "
            "uses M-RoPE: pass --mrope or --no-mrope",
            param="mrope",
        )
    return fleet, keys, remote, hosts


def main(argv: Sequence[str] | None = None) -> int:
    """Run the proxy until SIGTERM or SIGINT. Exit status 2 for a configuration it cannot
    serve; ``--print-config`` prints the effective configuration and exits 0."""
    configure_logging("text")
    try:
        args, shown = configuration(sys.argv[1:] if argv is None else argv, os.environ)
    except InvalidConfiguration as exc:
        print(f"pd-policy-proxy: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_format)
    if args.print_config:
        print(shown, end="")
        return 0
    try:
        kv_routing(args)  # its flags refused here, before any worker is called
        check_tracing(args.otlp_traces_endpoint)
        fleet, keys, remote, hosts = _configured(args)
    except (InvalidConfiguration, aiohttp.ClientError) as exc:
        print(f"pd-policy-proxy: {exc}", file=sys.stderr)
        return 2
    _members(fleet)
    probe = probe_of(args)

    def make() -> Proxy:
        return Proxy(
            fleet=fleet,
            mrope=bool(args.mrope),
            remote_media=remote,
            keys=keys,
            attempts=args.attempts,
            probe=probe if args.probe_interval > 0 else None,
            admin=args.admin,
            admin_hosts=hosts,
            log_requests=args.access_log,
            front_door=front_door(args),
            limits=upstream_limits(args),
            client_uuids=client_uuids(args),
            media_limits=media_limits(args),
            request_timeout=args.request_timeout,
            kv_routing=kv_routing(args),
            render_once=args.render_once,
            discovery=discovery_of(args),
            # Made in each process (its exporter's thread does not survive a fork).
            tracing=otlp_tracing(args.otlp_traces_endpoint, args.otlp_traces_sample_ratio),
        )

    if args.processes > 1:
        return processes(args, make)
    serve(args, make())
    return 0


if __name__ == "__main__":
    sys.exit(main())

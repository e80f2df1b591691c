"""Reading the configuration again while serving: on SIGHUP
([`serving`][pd_policy_vllm.http.serving]), the flags, the environment and the
``--config`` file are read anew, by the same rules as at start.

What a reload changes: the workers (those of the flags and of ``[[workers]]``, as the
operator now describes them: a new one is described and joins once a probe passes; one
no longer listed drains, its requests in flight finishing, and leaves; one whose table
changed is described anew as it), the names followed in DNS (``[[discover]]``: a name
kept goes on with the workers it found, a new one is followed, the workers of one
removed drain), the clients' and admins' keys, and the limits read as each request or
connection begins ([`LIMITS`][pd_policy_vllm.http.config.reloaded.LIMITS]: a request in flight
keeps the ones it began with; a kept-alive connection to a worker takes the new ones
with its next leg). Every other setting takes a restart: a reload that changes one says
so in its log line and keeps the value the proxy runs with. Among the limits, those
bound as the proxy starts take one too: ``max_body_mib`` (the server's own cap on a
compressed body and on the admin API's), ``keepalive_timeout`` (``aiohttp``'s timer,
set for its connections as it starts), and the ``media_*`` limits (the media session,
its guard and its timeout, is made with them). A file that cannot be read, a bad
value, a keys file that holds no key: the reload is refused, logged, and the running
configuration kept whole. Requests in flight finish on the view they started with.

A reload makes the fleet the configuration's: a worker an admin added at run time, and
not in the file, drains; a worker a followed name gives is the name's, not the file's.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from pd_policy import Health, InvalidConfiguration
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.auth import ADMIN_KEYS_ENV, Keys, read_keys
from pd_policy_vllm.http.config.load import configuration
from pd_policy_vllm.http.config.reloaded import LIMITS, RELOADED
from pd_policy_vllm.http.config.settings import settings
from pd_policy_vllm.http.flags import front_door, operator_says, parser, upstream_limits
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.discovery import Discovery
from pd_policy_vllm.http.fleet.members import member_name
from pd_policy_vllm.http.log_filter import install as redact_logs
from pd_policy_vllm.http.proxy import Proxy

__all__ = ["LIMITS", "RELOADED", "Reload", "reload", "summary", "wanted_workers"]


@attrs.frozen(slots=True)
class Reload:
    """What a reload did: the members that joined (``role name``), the ones that drain,
    the ones described anew, those it could not describe (left out until the next), the
    limits it changed, and the settings that changed but take a restart."""

    added: tuple[str, ...] = ()
    drained: tuple[str, ...] = ()
    redescribed: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    limits: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()


def wanted_workers(args: argparse.Namespace) -> dict[tuple[str, str], tuple[str, OperatorSays]]:
    """Every worker ``args`` lists, by role and member name: its URL and what the
    operator says of it."""
    says = operator_says(args)
    out = {}
    for role in ("prefill", "decode", "encode"):
        for url in getattr(args, role):
            out[(role, member_name(url))] = (url, says)
    for entry in getattr(args, "workers", ()):
        out[(entry.role, member_name(entry.url))] = (entry.url, entry.says(says))
    return out


def _keys(args: argparse.Namespace, environ: Mapping[str, str]) -> Keys:
    # The admins' keys are a setting (flag, environment, file): resolved already.
    env = {k: v for k, v in environ.items() if k != ADMIN_KEYS_ENV}
    return read_keys(
        env,
        worker_key_file=args.worker_api_key_file,
        client_keys_file=args.api_keys_file,
        admin_keys=args.admin_api_key,
        admin_keys_file=args.admin_api_keys_file,
    )


def _changed(old: argparse.Namespace, new: argparse.Namespace) -> list[str]:
    return [s.key for s in settings(parser()) if getattr(old, s.key) != getattr(new, s.key)]


async def reload(
    proxy: Proxy,
    running: argparse.Namespace,
    argv: Sequence[str],
    environ: Mapping[str, str] | None = None,
    *,
    stated: dict[tuple[str, str], OperatorSays] | None = None,
) -> tuple[argparse.Namespace, Reload]:
    """Apply the configuration ``argv`` and ``environ`` (the process's by default) now
    give to ``proxy``, which runs with ``running``; the settings it then runs with, and
    what changed. ``stated``: the prober's descriptions by role and member name, updated
    in place. Raises [`InvalidConfiguration`][pd_policy.errors.InvalidConfiguration] for
    a configuration that cannot be read, having changed nothing."""
    environ = os.environ if environ is None else environ
    new, _ = configuration(argv, environ)
    keys = _keys(new, environ)
    changed = _changed(running, new)
    restart = [key for key in changed if key not in RELOADED]
    if keys.worker != proxy.keys.worker:
        restart.append("worker_api_key_file")
    # Every reloaded setting takes its new value; the others keep the running one.
    applied = argparse.Namespace(**{
        **vars(running),
        **{key: getattr(new, key) for key in RELOADED if hasattr(new, key)},
        "workers": new.workers,
        "discover": new.discover,
    })  # fmt: skip
    wanted = wanted_workers(applied)
    running_says = operator_says(running)
    present = {(m.role, m.name): m for m in proxy.fleet}
    headers = proxy.keys.worker_headers()
    added: list[str] = []
    drained: list[str] = []
    redescribed: list[str] = []
    unreachable: list[str] = []
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for (role, name), (url, says) in wanted.items():
            member = present.get((role, name))
            old = (stated or {}).get((role, name), running_says)
            kept = member is not None and member.health.health is not Health.DRAINING
            if kept and old == says:
                continue
            try:
                worker = await describe(session, url, role, says, headers)
            except (aiohttp.ClientError, TimeoutError, InvalidConfiguration):
                unreachable.append(f"{role} {name}")
                continue
            proxy.fleet.add(role, worker, healthy=False)  # serves once a probe passes
            (redescribed if member is not None else added).append(f"{role} {name}")
    found = proxy.following.found() if proxy.following is not None else set()
    for (role, name), member in present.items():
        listed = (role, name) in wanted or (role, name) in found  # DNS's are DNS's to drain
        if not listed and member.health.health is not Health.DRAINING:
            proxy.fleet.drain(member)
            drained.append(f"{role} {name}")
    if stated is not None:
        dns = {key: said for key, said in stated.items() if key in found and key not in wanted}
        stated.clear()
        stated.update({**dns, **{key: said for key, (_, said) in wanted.items()}})
    _follow(proxy, applied)
    proxy.relimit(front_door(applied), upstream_limits(applied), applied.request_timeout)
    redact_logs(keys)  # the filter adds them: an old key stays redacted, once a secret
    proxy.keys = Keys(proxy.keys.worker, keys.clients, keys.admins)
    limits = tuple(key for key in changed if key in LIMITS)
    done = Reload(tuple(added), tuple(drained), tuple(redescribed), tuple(unreachable),
                  limits, tuple(restart))  # fmt: skip
    return applied, done


def _follow(proxy: Proxy, applied: argparse.Namespace) -> None:
    # The names of the file's [[discover]] tables now: one kept goes on with what it
    # found, a new one starts, one gone stops and its workers drain. The resolver asked
    # (--dns-server) takes a restart.
    says = operator_says(applied)
    sources = tuple(entry.source(says) for entry in getattr(applied, "discover", ()))
    server = proxy.discovery.server if proxy.discovery is not None else applied.dns_server
    proxy.discovery = Discovery(sources, server) if sources else None
    if proxy.following is not None:
        proxy.following.follow(sources)


def summary(outcome: Reload) -> dict[str, Any]:
    """``outcome`` as one log record's fields."""
    return {name: list(value) for name, value in attrs.asdict(outcome).items() if value}

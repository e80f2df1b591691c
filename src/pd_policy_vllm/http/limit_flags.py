"""The flags of the proxy's limits on its clients, its workers and the media it fetches,
and the objects they make: [`FrontDoor`][pd_policy_vllm.http.front_door.FrontDoor],
[`Limits`][pd_policy_vllm.http.upstream.limits.Limits] and
[`MediaLimits`][pd_policy_vllm.http.media.guard.MediaLimits]. Every default is the object's
own (``docs/security.md`` lists them, and a test holds it to the flags).
"""

from __future__ import annotations

import argparse
import ipaddress

from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS, DEFAULT_MAX_PARTS
from pd_policy_vllm.http.front_door import (
    BODY_TIMEOUT,
    HEADER_TIMEOUT,
    KEEPALIVE_TIMEOUT,
    MAX_CLIENT_CONNECTIONS,
    FrontDoor,
)
from pd_policy_vllm.http.media.guard import (
    MEDIA_MAX_BYTES,
    MEDIA_MAX_REDIRECTS,
    MEDIA_TIMEOUT,
    MediaLimits,
)
from pd_policy_vllm.http.upstream import DEFAULT_LIMITS, Limits
from pd_policy_vllm.openai.wire.body import MAX_BODY

__all__ = [
    "add_client_limit_flags",
    "add_media_limit_flags",
    "add_worker_limit_flags",
    "count",
    "front_door",
    "media_limits",
    "positive",
    "upstream_limits",
]


def positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {value}")
    return number


def count(value: str, least: int = 0) -> int:
    number = int(value)
    if number < least:
        raise argparse.ArgumentTypeError(f"must be {least} or more, not {value}")
    return number


def add_media_limit_flags(cli: argparse._ActionsContainer) -> None:
    """Add the limits on the media the proxy fetches to ``cli`` (a parser or a group)."""
    add = cli.add_argument
    add(
        "--media-max-bytes",
        type=lambda v: count(v, 1),
        default=MEDIA_MAX_BYTES,
        help="the most bytes the proxy fetches for one media item, beyond the worker's own "
        f"cap: a 422 above ({MEDIA_MAX_BYTES})",
    )
    add(
        "--media-max-redirects",
        type=count,
        default=MEDIA_MAX_REDIRECTS,
        help=f"redirects a media fetch may follow: a 422 past them ({MEDIA_MAX_REDIRECTS})",
    )
    add(
        "--media-timeout",
        type=positive,
        default=MEDIA_TIMEOUT,
        help="seconds one media fetch may take in all, beyond the worker's own time-out: "
        f"a 504 after ({MEDIA_TIMEOUT:g})",
    )
    add(
        "--media-allow-private-hosts",
        action="store_true",
        help="let the proxy fetch media from loopback, private and link-local addresses, "
        "which it refuses by default (labs only: a client could read the proxy's "
        "network)",
    )
    add(
        "--media-allow-network",
        action="append",
        default=[],
        metavar="CIDR",
        type=ipaddress.ip_network,
        help="a private network the proxy may fetch media from all the same, such as a "
        "lab's media server's (repeat)",
    )


def add_client_limit_flags(cli: argparse._ActionsContainer) -> None:
    """Add the limits on clients to ``cli`` (a parser or a group)."""
    add = cli.add_argument
    add(
        "--max-body-mib",
        type=positive,
        default=MAX_BODY / 2**20,
        help="the largest request body a client may send, in MiB: a 413 above (256)",
    )
    add(
        "--max-media-items",
        type=lambda v: count(v, 1),
        default=DEFAULT_MAX_MEDIA_ITEMS,
        help="the most media items (and parts carrying a uuid) one request may hold: a 400 "
        f"above, before any of them is read ({DEFAULT_MAX_MEDIA_ITEMS})",
    )
    add(
        "--max-content-parts",
        type=lambda v: count(v, 1),
        default=DEFAULT_MAX_PARTS,
        help="the most messages and content parts together one request may hold: a 400 "
        f"above, before any of them is read ({DEFAULT_MAX_PARTS})",
    )
    add(
        "--header-timeout",
        type=positive,
        default=HEADER_TIMEOUT,
        help="seconds a client has to send a request's headers once their first byte came: "
        f"the connection is closed after ({HEADER_TIMEOUT:g})",
    )
    add(
        "--keepalive-timeout",
        type=positive,
        default=KEEPALIVE_TIMEOUT,
        help="seconds an idle client connection is kept, from its start or the end of its "
        "last response, for a request to begin: keep it above a balancer's idle timeout "
        f"({KEEPALIVE_TIMEOUT:g})",
    )
    add(
        "--max-client-connections",
        type=lambda v: count(v, 1),
        default=MAX_CLIENT_CONNECTIONS,
        help="client connections open at once (per process): one past them is answered "
        f"503 pd_overloaded and closed before its request is read ({MAX_CLIENT_CONNECTIONS})",
    )
    add(
        "--body-timeout",
        type=positive,
        default=BODY_TIMEOUT,
        help="seconds a client has to send a request's whole body: a 408 after (300)",
    )
    add(
        "--request-timeout",
        type=positive,
        default=None,
        help="seconds a whole request may take, its retries included: a 504 after, or the "
        "stream's last event once it has begun (none)",
    )


def add_worker_limit_flags(cli: argparse._ActionsContainer) -> None:
    """Add the limits on the workers' answers to ``cli`` (a parser or a group)."""
    add = cli.add_argument
    add(
        "--worker-read-timeout",
        type=positive,
        default=DEFAULT_LIMITS.read_timeout,
        help="seconds a leg waits for a worker's answer, and its longest silence in one: "
        "a 504 after (600; a long prefill is not a fault)",
    )
    add(
        "--max-response-mib",
        type=positive,
        default=DEFAULT_LIMITS.max_response_bytes / 2**20,
        help="the largest answer a leg reads from a worker, in MiB: a 502 above (256)",
    )
    add(
        "--max-connections-per-worker",
        type=lambda v: count(v, 1),
        default=DEFAULT_LIMITS.max_connections,
        help="connections open at once to one worker; legs past it wait (256)",
    )
    add(
        "--worker-queue-timeout",
        type=positive,
        default=DEFAULT_LIMITS.queue_timeout,
        help="seconds a leg waits for a connection to a busy worker: a 503 after, and "
        "another worker is tried (30)",
    )


def upstream_limits(args: argparse.Namespace) -> Limits:
    """The bounds on the workers' answers the flags set."""
    return Limits(
        read_timeout=args.worker_read_timeout,
        max_response_bytes=int(args.max_response_mib * 2**20),
        max_connections=args.max_connections_per_worker,
        queue_timeout=args.worker_queue_timeout,
    )


def front_door(args: argparse.Namespace) -> FrontDoor:
    """The limits on clients the flags set."""
    return FrontDoor(
        max_body=int(args.max_body_mib * 2**20),
        max_media_items=args.max_media_items,
        max_parts=args.max_content_parts,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        keepalive_timeout=args.keepalive_timeout,
        max_connections=args.max_client_connections,
    )


def media_limits(args: argparse.Namespace) -> MediaLimits:
    """The proxy's own limits on a media fetch the flags set."""
    return MediaLimits(
        max_bytes=args.media_max_bytes,
        max_redirects=args.media_max_redirects,
        timeout=args.media_timeout,
        allow_private_hosts=args.media_allow_private_hosts,
        allow_networks=args.media_allow_network,
    )

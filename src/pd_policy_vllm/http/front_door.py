"""The front door: what a client's request must pass to get in, and what it is once in.

[`admit`][pd_policy_vllm.http.front_door.admit] takes a client the proxy let in (its key
checked first: [`Keys`][pd_policy_vllm.http.auth.Keys]), reads its body within the limits
below, parses it (a chat body with its data URLs left in its bytes), counts its media
items, scopes their uuids to its tenant, for the Responses API makes its chat
equivalent, and hashes its large items in a worker thread
([`digests`][pd_policy_vllm.openai.media.digests]): an
[`Incoming`][pd_policy_vllm.http.front_door.Incoming] request, or a typed refusal.

A client that trickles its request holds a connection, and the memory of what it sent,
for as long as the proxy waits for it (slowloris). So each part of a request has a
deadline, and the connections themselves a cap
([`client_gate`][pd_policy_vllm.http.client_gate] applies the first two):

- its connection: at most ``max_connections`` client connections are open at once; one
  past them is answered 503 ``pd_overloaded`` and closed before its request is read;
- its head (request line and headers): ``header_timeout`` seconds from its first byte,
  or the connection is closed;
- the wait for its first byte: ``keepalive_timeout`` seconds from the moment the
  connection opens, or from the end of the last response on it (``aiohttp``'s keep-alive
  timer, which closes a connection with no whole head when it fires). It is how long an
  idle keep-alive connection is kept: set it above the idle timeout of a balancer in
  front of the proxy, so that the balancer, not the proxy, closes an idle connection;
- its body: ``body_timeout`` seconds for the whole of it, from the end of the head, so
  that a client sending a byte now and then cannot hold it either; past it the client
  gets a 408 and the connection is closed;
- its size: ``max_body`` bytes, a 413 above (before it is read, when it declares its
  length).

Once parsed ([`parsing`][pd_policy_vllm.http.parsing]: in a thread when it is large), its
messages and parts and its media items are counted, and a request past a cap refused,
before any work on each part or item.

Refusals are the OpenAI error body of the error, with its status and error-code header
([`refusal`][pd_policy_vllm.http.front_door.refusal]).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, Final

import attrs

from pd_policy import BodyTooLarge, ClientTooSlow, ClientUuids, PolicyError, check_client_fields
from pd_policy.request_bounds import DEFAULT_MAX_MEDIA_ITEMS, DEFAULT_MAX_PARTS
from pd_policy.router_fields import RouterField, without_dropped
from pd_policy_vllm.http.aio import web
from pd_policy_vllm.http.parsing import OFF_THE_LOOP, parsed, streams
from pd_policy_vllm.openai.media.digests import hashing
from pd_policy_vllm.openai.media.tenant import scoped_body
from pd_policy_vllm.openai.plan.legs import Leg
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.responses import RESPONSES, chat_equivalent, responses_decode_leg
from pd_policy_vllm.openai.wire.body import MAX_BODY, read_body, too_large

__all__ = [
    "BODY_TIMEOUT",
    "HEADER_TIMEOUT",
    "KEEPALIVE_TIMEOUT",
    "MAX_CLIENT_CONNECTIONS",
    "FrontDoor",
    "Incoming",
    "admit",
    "client_body",
    "error_response",
    "refusal",
]
logger = logging.getLogger("pd_policy_vllm.http")
#: Seconds for a request's head once its first byte came, by default. A head is a few
#: KiB that a client sends in one write: 10 s is ample on any link, where node (60 s),
#: nginx (60 s) and hyper (30 s, with a timer: axum's ``serve``, SMG's, sets none) leave
#: a trickling client a minute, and uvicorn (vllm serve) no bound at all.
HEADER_TIMEOUT: Final = 10.0
#: Seconds an idle keep-alive connection is kept, by default: nginx's 75 s, above the
#: 60 s balancers close their own idle connections at, so that the proxy never closes
#: one a balancer is about to reuse (uvicorn's and vllm serve's 5 s suit a server that
#: clients reach directly, not one behind a balancer).
KEEPALIVE_TIMEOUT: Final = 75.0
#: Client connections one proxy process holds at once, by default: the streams of a
#: fleet of about eight decode workers at vLLM's 256 sequences each. A stream whose
#: client stopped reading costs the proxy about half a MiB (the legs' window, one read
#: of a socket, aiohttp's write buffer): about 1 GiB were every connection one.
MAX_CLIENT_CONNECTIONS: Final = 2048
#: Seconds for a whole body, by default: 256 MiB at about 1 MB/s.
BODY_TIMEOUT: Final = 300.0


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be positive, not {value!r}")


@attrs.frozen(slots=True)
class FrontDoor:
    """The limits on clients (see the module docs). Raises ``ValueError`` for a limit that
    is not positive."""

    max_body: int = attrs.field(default=MAX_BODY, validator=_positive)
    max_media_items: int = attrs.field(default=DEFAULT_MAX_MEDIA_ITEMS, validator=_positive)
    max_parts: int = attrs.field(default=DEFAULT_MAX_PARTS, validator=_positive)
    header_timeout: float = attrs.field(default=HEADER_TIMEOUT, validator=_positive)
    body_timeout: float = attrs.field(default=BODY_TIMEOUT, validator=_positive)
    keepalive_timeout: float = attrs.field(default=KEEPALIVE_TIMEOUT, validator=_positive)
    max_connections: int = attrs.field(default=MAX_CLIENT_CONNECTIONS, validator=_positive)

    def server_args(self) -> dict[str, Any]:
        """The keywords of ``web.AppRunner`` that apply these limits to ``aiohttp``'s
        server (the application's own is its ``client_max_size``; the connections' cap
        and the heads' deadline are a [`GatedRunner`][
        pd_policy_vllm.http.client_gate.GatedRunner]'s, which passes these on)."""
        return {"keepalive_timeout": self.keepalive_timeout}


def error_response(error: PolicyError) -> web.Response:
    """The OpenAI error body of ``error``, with its status and error-code header."""
    return web.json_response(error.to_body(), status=error.status, headers=error.headers())


async def refusal(
    request: web.Request, error: PolicyError, headers: dict[str, str] | None = None
) -> web.StreamResponse:
    """The client's answer for ``error``, with ``headers`` besides the error's. A body too
    large ends its connection (the rest of it is not wanted); a client too slow gets its
    answer at once and the connection is closed after it, so that the slow body is not
    read any further."""
    response = error_response(error)
    response.headers.update(headers or {})
    if isinstance(error, BodyTooLarge):
        response.force_close()
    if not isinstance(error, ClientTooSlow):
        return response
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    # aiohttp would go on reading the rest of the body for its lingering time; the
    # transport sends what was written, then closes.
    if request.transport is not None:
        request.transport.close()
    return response


async def _whole(request: web.Request, limit: int) -> bytes:
    # The application's client_max_size is the door's limit: the server refuses more.
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise too_large(limit) from None


@attrs.frozen(slots=True)
class Incoming:
    """A client's request, admitted: its id (the proxy's own, the one every leg carries),
    the ``route`` it is planned as and the ``path`` it came on, its ``body`` (parsed; its
    uuids scoped, the router's fields a client may send dropped), the client's bytes a
    prefill leg may be spliced from (``raw``: ``None`` once the body was changed), whether
    it streams, for another API planned as chat (the Responses API) how its decode leg is
    made of the chat one (``translate``), and the id the client gave it (``client_id``,
    its ``X-Request-Id``: for the log, and echoed back)."""

    request_id: str
    route: Route
    path: str
    body: Any
    raw: bytes | None
    stream: bool
    translate: Callable[[Leg, bool], Leg] | None = None
    client_id: str | None = None
    #: The id the answer carries back: the client's, else the proxy's own.
    echo: str = attrs.field(
        default=attrs.Factory(
            lambda self: self.client_id if self.client_id is not None else self.request_id,
            takes_self=True,
        )
    )


async def client_body(request: web.Request, door: FrontDoor) -> bytes:
    """The whole body of ``request``, within ``door``'s limits
    ([`read_body`][pd_policy_vllm.openai.wire.body.read_body] over ``aiohttp``'s reads).
    Raises its refusals: 413, 408, 400."""
    # A compressed body is decompressed by the server: its length is known at its end.
    declared = None if "Content-Encoding" in request.headers else request.content_length
    whole = functools.partial(_whole, request, door.max_body)
    return await read_body(
        declared, request.content.readany, whole, door.max_body, door.body_timeout
    )


async def admit(
    request: web.Request,
    route: Route,
    request_id: str,
    door: FrontDoor,
    uuids: ClientUuids,
    *,
    keyed: bool,
    served_as: str | None = None,
    client_id: str | None = None,
) -> Incoming:
    """The request ``request_id`` of a client the proxy let in, admitted (see the module
    docs): ``keyed`` when the proxy checks clients' keys (its bearer key is then one of
    its tenant's names); ``served_as`` is the client's route when it is another API
    planned as ``route``; ``client_id`` the id the client gave it. Raises the refusals of
    reading and parsing the body (413, 408, 400; a ``stream`` that is not a boolean is a
    400 too), [`TooManyMediaItems`][pd_policy.client_errors.TooManyMediaItems] (400), and
    [`RouterOwnedField`][pd_policy.client_errors.RouterOwnedField] (400) for a field only
    the router may set: no worker ever sees one of a client's."""
    raw = await client_body(request, door)
    parse = functools.partial(
        parsed,
        raw,
        skims=route is Route.CHAT and served_as is None,
        max_parts=door.max_parts,
        max_media_items=door.max_media_items,
    )
    # A large body's parse and counts run in a thread: a body of many small values is a
    # step of Python each, and the loop answers everyone else meanwhile.
    body = parse() if len(raw) < OFF_THE_LOOP else await asyncio.to_thread(parse)
    dropped = check_client_fields(body)
    if dropped:
        body = _dropping(body, dropped)
    stream = streams(body)
    authorization = request.headers.get("Authorization")
    body, spliceable = scoped_body(body, raw, authorization, keyed=keyed, mode=uuids)
    translate = None
    if served_as == RESPONSES:
        # Planned as its chat equivalent (what vLLM renders it as); its decode leg is the
        # client's own request, with what the chat leg carries.
        translate = functools.partial(responses_decode_leg, body)
        body, spliceable = chat_equivalent(body), None
    work = hashing(body)
    if work is not None:
        # Its large items hashed in a thread: the plan finds their digests on them.
        body = await asyncio.to_thread(work)
    path = served_as or route.value
    return Incoming(request_id, route, path, body, spliceable, stream, translate, client_id)


_told: set[str] = set()


def _dropping(body: Any, dropped: tuple[RouterField, ...]) -> Any:
    # vLLM's own clients send these: dropped, not refused, and said once a process at INFO
    # (a client that sends one sends it on every request).
    for field in dropped:
        level = logging.DEBUG if field.name in _told else logging.INFO
        _told.add(field.name)
        logger.log(level, "dropped a client's %s: the router sets its own", field.name)
    return without_dropped(body, dropped)

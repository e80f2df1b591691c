"""The fleet's routes: list the members, add one, drain one. Served with ``--admin``.

- ``GET /admin/workers``: each member's role, name, health and load;
- ``POST /admin/workers`` ``{"role": "decode", "url": "http://host:port"}``: the worker is
  described and joins (201), or the answer says why not;
- ``DELETE /admin/workers`` ``{"url": ...}``: the member drains: no new request goes to
  it, and it leaves once its requests are done (202).

They take an admin's key, never a client's: anyone else gets a 403 (``pd_forbidden``),
anonymous or not, and nothing is called. With ``--admin-allowed-hosts``, a worker is
added only on a host it lists
([`AllowedHosts`][pd_policy_vllm.http.fleet.allowed_hosts.AllowedHosts]), else a 403
and nothing is called: so the workers' key goes only to workers the operator listed, or
an admin added within the operator's bounds. Every change, and every refusal of
one, is a line on the ``pd_policy_vllm.http.admin`` logger: the admin's key id, the
action, the role, the member's name, the outcome. A URL is never echoed nor logged: a
member is shown by its name (``scheme://host:port``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

import attrs

from pd_policy import Forbidden, InvalidConfiguration, MalformedRequest, PolicyError
from pd_policy_vllm.http.aio import aiohttp, web
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.calls import unreachable
from pd_policy_vllm.http.fleet.allowed_hosts import AllowedHosts
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.members import ROLES, Fleet, member_name
from pd_policy_vllm.http.front_door import error_response
from pd_policy_vllm.openai.wire.codec import loads

__all__ = ["Admin", "add_admin_routes"]

_ROUTE = "/admin/workers"
audit: Final = logging.getLogger("pd_policy_vllm.http.admin")


_DONE: Final = frozenset({"added", "draining"})


def _name(url: object) -> str:
    # The member's name: the URL less its credentials, path and query; a caller's URL
    # that would write more than a name into the line (a line break, say) is not written.
    try:
        name = member_name(url) if isinstance(url, str) else "-"
    except (ValueError, InvalidConfiguration):  # a URL no worker could be at
        return "-"
    return name if name.isascii() and name.isprintable() else "-"


def _log(who: str | None, action: str, role: object, url: object, outcome: str) -> None:
    # A refusal is a warning: someone tried to change the fleet and could not.
    role = role if isinstance(role, str) and role in ROLES else "-"
    audit.log(
        logging.INFO if outcome in _DONE else logging.WARNING,
        "admin %s role=%s worker=%s by=%s outcome=%s",
        action,
        role,
        _name(url),
        f"key:{who}" if who else "not-an-admin",
        outcome,
    )


@attrs.frozen
class Admin:
    """What the admin routes act on: the ``fleet``, the ``keys`` as they are now (the
    admins' admit, the workers' go to a worker described; a reload changes them), the
    ``hosts`` a worker may be added on (``None``:
    any), what the operator ``says`` of workers that do not describe themselves, and the
    ``session`` the proxy calls its workers with, for a request."""

    fleet: Fleet
    keys: Callable[[], Keys]
    hosts: AllowedHosts | None
    says: OperatorSays
    session: Callable[[web.Request], aiohttp.ClientSession]


def add_admin_routes(app: web.Application, admin: Admin) -> None:
    """Serve the fleet's routes on ``app``, over ``admin``'s fleet."""

    def caller(request: web.Request) -> str | None:
        return admin.keys().admin(request.headers.get("Authorization"))

    async def listing(request: web.Request) -> web.Response:
        if caller(request) is None:
            return error_response(Forbidden())
        members = [
            {
                "role": m.role,
                "name": m.name,
                "health": m.health.health.value,
                "outstanding": m.outstanding,
                "language_model_only": m.worker.capability.language_model_only,
            }
            for m in admin.fleet
        ]
        return web.json_response({"workers": members})

    async def body_of(request: web.Request) -> dict[str, Any]:
        body = loads(await request.read())
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            raise MalformedRequest("the body must be an object with a url", param="url")
        return body

    async def join(request: web.Request) -> web.Response:
        who, body = caller(request), None
        try:
            if who is None:
                raise Forbidden()
            body = await body_of(request)
            role = body.get("role")
            if role not in ROLES:
                raise MalformedRequest(f"role must be one of {', '.join(ROLES)}", param="role")
            hosts = admin.hosts
            if hosts is not None and not hosts.allows(body["url"]):
                raise Forbidden(
                    "the worker's host is not one --admin-allowed-hosts lists", param="url"
                )
            headers = admin.keys().worker_headers()
            try:
                session = admin.session(request)
                worker = await describe(session, body["url"], role, admin.says, headers)
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise unreachable(role if role != "encode" else "encode", exc) from exc
            member = admin.fleet.add(role, worker)
        except (PolicyError, InvalidConfiguration) as exc:
            body = body or {}
            _log(who, "add", body.get("role"), body.get("url"), exc.code)
            return error_response(exc)
        _log(who, "add", role, body["url"], "added")
        return web.json_response({"role": role, "name": member.name}, status=201)

    async def leave(request: web.Request) -> web.Response:
        who, body = caller(request), None
        try:
            if who is None:
                raise Forbidden()
            body = await body_of(request)
            member = admin.fleet.find(body["url"])
            if member is None:
                raise MalformedRequest("no member at that URL", param="url")
        except (PolicyError, InvalidConfiguration) as exc:
            _log(who, "drain", None, (body or {}).get("url"), exc.code)
            return error_response(exc)
        admin.fleet.drain(member)
        _log(who, "drain", member.role, member.worker.url, "draining")
        return web.json_response({"name": member.name, "health": "draining"}, status=202)

    app.router.add_get(_ROUTE, listing)
    app.router.add_post(_ROUTE, join)
    app.router.add_delete(_ROUTE, leave)

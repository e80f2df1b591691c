"""The fleet's routes: list the members, add one, drain one. Served with ``--admin``.

- ``GET /admin/workers``: each member's role, name, health and load;
- ``POST /admin/workers`` ``{"role": "decode", "url": "http://host:port"}``: the worker is
  described and joins (201), or the answer says why not;
- ``DELETE /admin/workers`` ``{"url": ...}``: the member drains: no new request goes to
  it, and it leaves once its requests are done (202).

They take the clients' key when one is set, like every route but ``/health``. A URL is
never echoed: a member is shown by its name (``scheme://host:port``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pd_policy import InvalidConfiguration, MalformedRequest, PolicyError
from pd_policy_vllm.http.aio import aiohttp, web
from pd_policy_vllm.http.codec import loads
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.members import ROLES
from pd_policy_vllm.http.relay import error_response, unreachable

if TYPE_CHECKING:
    from pd_policy_vllm.http.proxy import Proxy

__all__ = ["add_admin_routes"]

_ROUTE = "/admin/workers"


def add_admin_routes(app: web.Application, proxy: Proxy) -> None:
    """Serve the fleet's routes on ``app``."""

    async def listing(request: web.Request) -> web.Response:
        refused = proxy.admitted(request)
        if refused is not None:
            return refused
        members = [
            {"role": m.role, "name": m.name, "health": m.health.health.value,
             "outstanding": m.outstanding,
             "language_model_only": m.worker.capability.language_model_only}
            for m in proxy.fleet
        ]  # fmt: skip
        return web.json_response({"workers": members})

    async def body_of(request: web.Request) -> dict[str, Any]:
        body = loads(await request.read())
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            raise MalformedRequest("the body must be an object with a url", param="url")
        return body

    async def join(request: web.Request) -> web.Response:
        refused = proxy.admitted(request)
        if refused is not None:
            return refused
        try:
            body = await body_of(request)
            role = body.get("role")
            if role not in ROLES:
                raise MalformedRequest(f"role must be one of {', '.join(ROLES)}", param="role")
            says = proxy.probe.says if proxy.probe is not None else OperatorSays()
            try:
                worker = await describe(proxy.session(request), body["url"], role, says,
                                        proxy.keys.worker_headers())  # fmt: skip
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise unreachable(role if role != "encode" else "encode", exc) from exc
            member = proxy.fleet.add(role, worker, healthy=True)
        except (PolicyError, InvalidConfiguration) as exc:
            return error_response(exc)
        return web.json_response({"role": role, "name": member.name}, status=201)

    async def leave(request: web.Request) -> web.Response:
        refused = proxy.admitted(request)
        if refused is not None:
            return refused
        try:
            body = await body_of(request)
        except PolicyError as exc:
            return error_response(exc)
        member = proxy.fleet.find(body["url"])
        if member is None:
            return error_response(MalformedRequest("no member at that URL", param="url"))
        proxy.fleet.drain(member)
        return web.json_response({"name": member.name, "health": "draining"}, status=202)

    app.router.add_get(_ROUTE, listing)
    app.router.add_post(_ROUTE, join)
    app.router.add_delete(_ROUTE, leave)

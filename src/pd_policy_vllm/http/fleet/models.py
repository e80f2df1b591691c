"""``GET /v1/models`` from a fleet: every routable prefill's models, each model once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pd_policy import WorkerFailedToStart
from pd_policy_vllm.http.aio import aiohttp, web
from pd_policy_vllm.http.auth import for_url
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.front_door import error_response

__all__ = ["fleet_models"]


async def fleet_models(
    session: aiohttp.ClientSession, fleet: Fleet, headers: Mapping[str, str]
) -> web.Response:
    """The models of ``fleet``'s prefills (asked with ``headers``: the workers' key) as
    vLLM lists them; a 503 when none answers. A worker that cannot be reached or
    answers with an error is left out."""
    seen: dict[str, Any] = {}
    for member in fleet.of("prefill"):
        url = member.worker.url
        try:
            async with session.get(
                f"{url}/v1/models", headers=for_url(headers, url), allow_redirects=False
            ) as response:
                if response.status == 200:
                    for model in (await response.json()).get("data", []):
                        seen.setdefault(model.get("id"), model)
        except aiohttp.ClientError:
            continue
    if not seen:
        return error_response(WorkerFailedToStart("prefill", detail="no model", http_status=503))
    return web.json_response({"object": "list", "data": list(seen.values())})

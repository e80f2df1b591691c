"""Active health checks: the proxy probes each member, and describes it anew when it comes
back, since it may come back as another kind.

Every ``interval`` seconds each member gets ``GET /health``. A member in service that
fails it is ejected; one that is starting, or ejected with its wait over, is described
anew ([`describe`][pd_policy_vllm.http.fleet.describe.describe]) and re-admitted when it
passes. A member in service is described anew every ``redescribe`` seconds too, for a
worker restarted between two probes. A draining member is removed once it holds no
request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import attrs

from pd_policy import Health, InvalidConfiguration, routable
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.auth import for_url
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.members import Fleet, Member

__all__ = ["Probe", "probe_once", "probing"]


@attrs.frozen(slots=True)
class Probe:
    """How often members are probed and described, and what the operator says of those
    that do not describe themselves."""

    interval: float = 2.0
    timeout: float = 2.0
    redescribe: float = 30.0
    says: OperatorSays = attrs.field(factory=OperatorSays)


async def _healthy(
    session: aiohttp.ClientSession, member: Member, probe: Probe, headers: Mapping[str, str]
) -> bool:
    try:
        async with session.get(
            f"{member.worker.url}/health", headers=for_url(headers, member.worker.url),
            timeout=aiohttp.ClientTimeout(total=probe.timeout), allow_redirects=False,
        ) as response:  # fmt: skip
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def probe_once(
    fleet: Fleet,
    session: aiohttp.ClientSession,
    probe: Probe,
    headers: Mapping[str, str],
    described: dict[str, float],
) -> None:
    """Probe every member once. ``described`` maps a member's URL to when it was last
    described (kept between calls)."""
    for member in fleet:
        if member.health.health is Health.DRAINING:
            if member.outstanding == 0:
                fleet.remove(member)
            continue
        now = fleet.clock()
        if not routable(member.health) and not member.health.probe_due(now):
            continue
        if not await _healthy(session, member, probe, headers):
            fleet.probe_failed(member)
            continue
        due = now - described.get(member.worker.url, float("-inf")) >= probe.redescribe
        if routable(member.health) and not due:
            continue
        try:
            worker = await describe(session, member.worker.url, member.role, probe.says, headers)
        except (aiohttp.ClientError, TimeoutError, InvalidConfiguration):
            fleet.probe_failed(member)
            continue
        described[member.worker.url] = now
        if routable(member.health):
            fleet.redescribe(member, worker)
        else:
            fleet.readmit(member, worker)


@contextlib.asynccontextmanager
async def probing(
    fleet: Fleet, session: aiohttp.ClientSession, probe: Probe, headers: Mapping[str, str]
) -> AsyncIterator[None]:
    """Probe the fleet in the background for the duration of the block."""
    described: dict[str, float] = {}

    async def loop() -> None:
        while True:
            await probe_once(fleet, session, probe, headers, described)
            await asyncio.sleep(probe.interval)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

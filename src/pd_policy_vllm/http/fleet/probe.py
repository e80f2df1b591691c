"""Active health checks over HTTP: the core's [`Prober`][pd_policy.fleet.probing.Prober] decides,
this module asks.

Every ``interval`` seconds each member the prober names gets ``GET /health``; when the
prober says so (a member coming back, or one whose description is old), the member is
described anew ([`describe`][pd_policy_vllm.http.fleet.describe.describe]), since it may
come back as another kind. No call follows a redirect: the workers' key goes only where
the operator, or an admin within the operator's bounds, sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import attrs

from pd_policy import InvalidConfiguration, Prober, ProbeTimes
from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.auth import for_url
from pd_policy_vllm.http.fleet.describe import OperatorSays, describe
from pd_policy_vllm.http.fleet.members import Fleet, Member
from pd_policy_vllm.openai.workers import HttpWorker

__all__ = ["Probe", "probe_once", "probing"]


@attrs.frozen(slots=True)
class Probe:
    """How often members are probed and described (the core's
    [`ProbeTimes`][pd_policy.fleet.probing.ProbeTimes]), and what the operator says of those
    that do not describe themselves: ``stated``, by role and member name, for the workers
    the configuration file describes one by one; ``says`` for the others."""

    interval: float = 2.0
    timeout: float = 2.0
    redescribe: float = 30.0
    says: OperatorSays = attrs.field(factory=OperatorSays)
    #: Changed in place by a reload and by DNS discovery, as workers come and go.
    stated: dict[tuple[str, str], OperatorSays] = attrs.field(factory=dict, eq=False)

    def says_of(self, member: Member) -> OperatorSays:
        """What the operator says of ``member``: its own description, else the flags'."""
        return self.stated.get((member.role, member.name), self.says)

    @property
    def times(self) -> ProbeTimes:
        return ProbeTimes(self.interval, self.timeout, self.redescribe)


async def _healthy(
    session: aiohttp.ClientSession, member: Member, timeout: float, headers: Mapping[str, str]
) -> bool:
    url = member.worker.url
    try:
        async with session.get(
            f"{url}/health",
            headers=for_url(headers, url),
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as response:
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def _described(
    session: aiohttp.ClientSession, member: Member, probe: Probe, headers: Mapping[str, str]
) -> HttpWorker | None:
    try:
        return await describe(
            session, member.worker.url, member.role, probe.says_of(member), headers
        )
    except (aiohttp.ClientError, TimeoutError, InvalidConfiguration):
        return None


async def probe_once(
    prober: Prober[HttpWorker],
    session: aiohttp.ClientSession,
    probe: Probe,
    headers: Mapping[str, str],
) -> None:
    """Probe every member ``prober`` names once, at the same time."""

    async def check(member: Member) -> None:
        healthy = await _healthy(session, member, probe.timeout, headers)
        if prober.checked(member, healthy):
            prober.described(member, await _described(session, member, probe, headers))

    await asyncio.gather(*(check(member) for member in prober.round()))


@contextlib.asynccontextmanager
async def probing(
    fleet: Fleet, session: aiohttp.ClientSession, probe: Probe, headers: Mapping[str, str]
) -> AsyncIterator[None]:
    """Probe the fleet in the background for the duration of the block."""
    prober = Prober(fleet, probe.times)

    async def loop() -> None:
        while True:
            await probe_once(prober, session, probe, headers)
            await asyncio.sleep(probe.interval)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

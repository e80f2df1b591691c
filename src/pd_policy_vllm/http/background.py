"""What a serving proxy runs beside its requests: the fleet's probes, the prefills'
KV-event feeds and the DNS names it follows, for as long as it serves."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.fleet.discovery import Discovery, Following, following
from pd_policy_vllm.http.fleet.kv_routing import KvRouting
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.fleet.probe import Probe, probing

__all__ = ["background"]


@contextlib.asynccontextmanager
async def background(
    fleet: Fleet,
    session: aiohttp.ClientSession,
    headers: Mapping[str, str],
    *,
    probe: Probe | None,
    kv_routing: KvRouting | None,
    discovery: Discovery | None,
) -> AsyncIterator[Following]:
    """Probe ``fleet`` (``probe``; ``None``: not at all), follow its prefills' KV events
    (``kv_routing``) and ``discovery``'s names for the duration of the block, calling the
    workers over ``session`` with ``headers``; the names followed (a reload gives it
    others). Leaving the block stops all of it, the fleet kept as it is."""
    probes = contextlib.nullcontext() if probe is None else probing(fleet, session, probe, headers)
    feeds = contextlib.nullcontext() if kv_routing is None else kv_routing.running(fleet)
    stated = probe.stated if probe is not None else None  # described as the prober does
    found = following(discovery, fleet, session, headers, stated)
    async with probes, feeds, found:
        yield found

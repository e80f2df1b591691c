"""The proxy's outgoing clients, which live as long as its application.

Three, because they are trusted differently: the workers' session (descriptions, probes,
``/v1/models``: the operator's workers, on private addresses as a rule), the legs'
[`Upstream`][pd_policy_vllm.http.upstream.Upstream] (bounded by its
[`Limits`][pd_policy_vllm.http.upstream.Limits]), and the media session, whose guard
refuses the private addresses the workers are on
([`media_session`][pd_policy_vllm.http.media.guard.media_session]).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import attrs

from pd_policy_vllm.http.aio import aiohttp
from pd_policy_vllm.http.media.guard import MediaLimits, media_session
from pd_policy_vllm.http.redact import Redactor
from pd_policy_vllm.http.upstream import Limits, Observer, Upstream

__all__ = ["Clients", "open_clients"]


@attrs.frozen(slots=True)
class Clients:
    """The workers' session, the legs' client and the media session."""

    workers: aiohttp.ClientSession
    legs: Upstream
    media: aiohttp.ClientSession


@contextlib.asynccontextmanager
async def open_clients(
    limits: Limits,
    media_limits: MediaLimits,
    observers: Sequence[Observer],
    trace_configs: Sequence[aiohttp.TraceConfig],
    redactor: Redactor | None = None,
) -> AsyncIterator[Clients]:
    """The three clients, closed on leaving (the legs' connections too); the legs' redact
    what they relay of the workers' answers with ``redactor``."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=limits.connect_timeout)
    async with (
        media_session(media_limits, trace_configs=list(trace_configs)) as media,
        aiohttp.ClientSession(
            timeout=timeout, trace_configs=list(trace_configs) or None
        ) as workers,
    ):
        legs = Upstream(observers, limits, redactor)
        try:
            yield Clients(workers, legs, media)
        finally:
            legs.close()

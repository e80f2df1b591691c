"""Routing on what each prefill's prefix cache holds: the proxy's side of the core's
[`PrefixIndex`][pd_policy.cache.prefix_index.PrefixIndex].

Each prefill that publishes its KV events (read from its description:
[`kv_source_from_config`][pd_policy_vllm.kv_events.source.kv_source_from_config]) is fed
into one index while it is a member ([`Feeds`][pd_policy_vllm.kv_events.feeds.Feeds]).
Before a request is placed, its [`lookup`][pd_policy_vllm.http.fleet.kv_routing.KvRouting.lookup]
learns its expanded prompt (from a prefill's render route, or from a completions body's
token prompt), names its blocks as each prefill does, and counts the leading ones each
prefill holds: the placement prefers the prefill that holds the most, within the load
bound ([`choose`][pd_policy.fleet.balance.choose]).

A lookup names at most the prompt's first ``max_tokens`` tokens' blocks
([`LOOKUP_TOKENS`][pd_policy_vllm.http.fleet.kv_routing.LOOKUP_TOKENS] by default): each
block is a hash in Python on the proxy's event loop, and a client's prompt of token ids
is as long as the body cap lets it be. Past them the prefills' caches are not told
apart, which no context a model serves reaches.

A lookup never fails a request: a request that cannot be looked up (no prefill fed, no
prefill that renders, a render that fails or says nothing readable, media the proxy would
not let a worker fetch yet) is placed by the rules without it. Bodies with remote media
are not rendered at all: the proxy decides what to do with a URL (fetch it once, refuse
it) before any worker reads it, and a render would read it first.

The plan may take the render over, so that the request is rendered once: the M-RoPE
metadata path, and a prefill leg sent as token-in from it
([`render_once`][pd_policy_vllm.openai.plan.render_once]). The render then answers each
item's processed tensors too, which the lookup alone never needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, Final

import attrs

from pd_policy import MediaSource, PolicyError, routable
from pd_policy.cache.kv_blocks import HashAlgo, block_hasher, external_hash
from pd_policy.cache.prefix_index import PrefixIndex
from pd_policy_vllm.http.calls import post_json
from pd_policy_vllm.http.fleet.members import Fleet, Member
from pd_policy_vllm.http.fleet.routing import HttpPlacer
from pd_policy_vllm.http.upstream import Upstream
from pd_policy_vllm.kv_events.feed import FeedStats
from pd_policy_vllm.kv_events.feeds import Feeds, following
from pd_policy_vllm.kv_events.source import KvSource
from pd_policy_vllm.openai.media.parts import media_parts
from pd_policy_vllm.openai.plan.prefix import RENDERS, Prompt, prompt_of_body, prompt_of_render
from pd_policy_vllm.openai.plan.request import Route

__all__ = ["LOOKUP_TOKENS", "KvRouting", "Lookup"]

_log = logging.getLogger(__name__)
_UNREAD = (MediaSource.REMOTE, MediaSource.LOCAL)
#: The leading tokens of a prompt a lookup names blocks for, by default.
LOOKUP_TOKENS: Final = 1 << 17


@attrs.frozen(slots=True)
class Lookup:
    """What a lookup learned: the leading blocks of the request each fed prefill holds, by
    name, how many blocks its prompt has, and the render's answer when it rendered (a
    plan that renders on the same terms may take it)."""

    cached: Mapping[str, int]
    blocks: int
    rendered: Any = None
    route: Route | None = None


class KvRouting:
    """KV-event routing for a proxy's prefills: ``seed`` is the workers'
    ``PYTHONHASHSEED`` (``None``: unset), ``max_blocks`` bounds the hashes kept per
    worker, ``timeout`` a lookup's render and a feed's replay, ``max_tokens`` the leading
    tokens of a prompt it names blocks for."""

    def __init__(
        self,
        *,
        seed: str | None = None,
        max_blocks: int = 1 << 20,
        timeout: float = 2.0,
        max_tokens: int = LOOKUP_TOKENS,
    ) -> None:
        self.seed, self.timeout, self.max_tokens = seed, timeout, max_tokens
        self.index = PrefixIndex(max_blocks=max_blocks)
        self.feeds: Feeds | None = None

    @contextlib.asynccontextmanager
    async def running(
        self, fleet: Fleet, on_batch: Any = None, interval: float = 1.0
    ) -> AsyncIterator[None]:
        """Feed the index from ``fleet``'s prefills for the duration of the block,
        following the fleet's changes every ``interval`` seconds."""
        self.feeds = Feeds(self.index, timeout=self.timeout, on_batch=on_batch)

        def sources() -> dict[str, KvSource]:
            prefills = fleet.of("prefill")
            return {m.name: m.worker.kv_events for m in prefills if m.worker.kv_events}

        try:
            async with following(self.feeds, sources, interval):
                yield
        finally:
            self.feeds = None

    def stats(self) -> dict[str, FeedStats]:
        """Each fed prefill's feed statistics, by name."""
        if self.feeds is None:
            return {}
        return {n: s for n in self.feeds.sources if (s := self.feeds.stats(n)) is not None}

    def _fed(self, fleet: Fleet) -> list[Member]:
        return [
            m
            for m in fleet.of("prefill")
            if m.worker.kv_events is not None and self.index.synced(m.name)
        ]

    async def lookup(
        self,
        placer: HttpPlacer,
        upstream: Upstream,
        headers: Mapping[str, str],
        tensors: bool | None = None,
    ) -> Lookup | None:
        """The request of ``placer``, looked up (see the module docs); ``None`` when it
        cannot be. Renders on a routable prefill that serves the render route, over
        ``upstream`` with ``headers``; bounded by ``timeout``. ``tensors``: the render
        answers each item's processed tensors, for a plan that may take it over
        ([`lookup_tensors`][pd_policy_vllm.http.planning.Planning.lookup_tensors];
        ``None``: for the M-RoPE metadata path only)."""
        fed = self._fed(placer.fleet)
        if not fed:
            return None
        body, route = placer.body, placer.route
        try:
            request = placer.request  # the policy's refusals come first, before any worker
            if request.n > 1:
                return None  # no prefill runs
            prompt = prompt_of_body(body, route)
            rendered = None
            if prompt is None:
                wanted = placer.mrope if tensors is None else tensors
                rendered = await self._render(placer, upstream, headers, wanted)
                if rendered is None:
                    return None
                prompt = prompt_of_render(rendered, body)
            cached, blocks = self._count(fed, prompt)  # refuses ids no vocabulary has
        except (PolicyError, TimeoutError):
            return None
        except Exception:  # a hint that fails costs the hint, never the request
            _log.warning("a KV lookup failed: placed without it", exc_info=True)
            return None
        return Lookup(cached, blocks, rendered, route if rendered is not None else None)

    async def _render(
        self, placer: HttpPlacer, upstream: Upstream, headers: Mapping[str, str], tensors: bool
    ) -> Any:
        route = RENDERS.get(placer.route)
        renderers = [
            m for m in placer.fleet.of("prefill") if m.worker.renders and routable(m.health)
        ]
        if route is None or not renderers:
            return None
        media = placer.media
        # A completions prompt has no media part: only a chat body's are read here.
        if placer.route is Route.CHAT and (
            media is None
            or any(part.source in _UNREAD for part in media_parts(placer.body, media.rules))
        ):
            return None  # remote media: the proxy's to fetch or refuse first
        member = min(renderers, key=lambda m: m.outstanding)
        # The lookup reads ids, hashes and places. A render answers each item's processed
        # tensors too unless told not to (megabytes an image, parsed here): only a plan
        # that may take the render over needs them.
        body = placer.body if tensors else {**placer.body, "mm_payload": "none"}
        async with asyncio.timeout(self.timeout):
            # A prefill's route: its failure reads as the prefill's (and is only a miss).
            return await post_json(upstream, "prefill", member.worker.url + route, body, headers)

    def _count(self, fed: list[Member], prompt: Prompt) -> tuple[dict[str, int], int]:
        prompt = prompt.leading(self.max_tokens)  # a block's hash is Python, on the loop
        cached: dict[str, int] = {}
        chains: dict[tuple[int, HashAlgo], list[int]] = {}
        blocks = 0
        for member in fed:
            source = member.worker.kv_events
            assert source is not None
            key = (source.block_size, source.algo)
            chain = chains.get(key)
            if chain is None:
                hashes = block_hasher(*key, self.seed).hashes(
                    prompt.token_ids, prompt.items, cache_salt=prompt.cache_salt
                )
                chain = chains[key] = [external_hash(h) for h in hashes]
            blocks = max(blocks, len(chain))
            cached[member.name] = self.index.cached([member.name], chain)[member.name]
        return cached, blocks

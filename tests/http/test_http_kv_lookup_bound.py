"""A KV-routing lookup names the blocks of a prompt's first ``max_tokens`` tokens only.

The attack: a completions request whose prompt is millions of token ids (the body cap
allows tens of millions). The lookup named every block of it, each a hash in Python on
the proxy's event loop, before the request was placed: seconds for one request, every
other client held. The names of the leading blocks are those of the whole prompt's, so
the bound changes no prediction within it.
"""

from __future__ import annotations

from typing import Any

import pytest

from pd_policy.cache.kv_blocks import HashAlgo, MmSpan, block_hasher
from pd_policy_vllm.http.fleet import kv_routing
from pd_policy_vllm.http.fleet.kv_routing import LOOKUP_TOKENS, KvRouting
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.kv_events.source import KvSource
from pd_policy_vllm.openai.plan.prefix import Prompt
from pd_policy_vllm.openai.workers import HttpWorker

SOURCE = KvSource("tcp://127.0.0.1:1", None, "", 16, HashAlgo.SHA256)


@pytest.mark.parametrize("most", [1, 16, 40, 47, 48, 200])
def test_the_leading_blocks_are_named_as_the_whole_prompts(most: int) -> None:
    ids = tuple(range(100, 196))
    items = (MmSpan("a", 4, 20), MmSpan("b", 40, 30), MmSpan("c", 80, 4))
    prompt = Prompt(ids, items, "salt")
    hasher = block_hasher(16)
    whole = hasher.hashes(prompt.token_ids, prompt.items, cache_salt=prompt.cache_salt)
    cut = prompt.leading(most)
    assert len(cut.token_ids) == min(most, len(ids))
    assert hasher.hashes(cut.token_ids, cut.items, cache_salt="salt") == whole[: most // 16]


def test_a_lookup_hashes_no_more_than_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []

    class Counting:
        def __init__(self, *args: Any) -> None:
            self.inner = block_hasher(*args)

        def hashes(self, token_ids: Any, *args: Any, **kwargs: Any) -> list[bytes]:
            hashed.append(len(token_ids))
            return self.inner.hashes(token_ids, *args, **kwargs)

    monkeypatch.setattr(kv_routing, "block_hasher", Counting)
    fleet = Fleet()
    member = fleet.add("prefill", HttpWorker("http://127.0.0.1:1", kv_events=SOURCE))
    routing = KvRouting(max_tokens=64)
    cached, blocks = routing._count([member], Prompt(tuple(range(10_000))))
    assert hashed == [64] and blocks == 4 and cached == {member.name: 0}
    assert KvRouting().max_tokens == LOOKUP_TOKENS

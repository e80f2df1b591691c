"""The core's block hashes against vLLM's own: the block hasher a vLLM request gets
(``get_request_block_hasher``), on requests drawn with media items, salts and LoRA
adapters, under both hash algorithms a router can follow, and the event form of each.

Each item's identifier is a string object of its own, as a served worker holds the keys it
decoded (the ``sha256`` algorithm hashes a pickle, which writes one object met twice as a
reference). The live test (``http/test_http_kv_routing_live.py``) checks a real server's
events agree.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from vllm import SamplingParams
from vllm.lora.request import LoRARequest
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request

from pd_policy.cache.kv_blocks import BlockHasher, HashAlgo, MmSpan, external_hash
from pd_policy.errors import InvalidConfiguration, MalformedRequest


def _own(text: str) -> str:
    return "".join(list(text))  # a new object (two equal identifiers are two objects)


@contextmanager
def hash_seed(seed: str | None) -> Iterator[None]:
    before = os.environ.get("PYTHONHASHSEED")
    if seed is None:
        os.environ.pop("PYTHONHASHSEED", None)
    else:
        os.environ["PYTHONHASHSEED"] = seed
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("PYTHONHASHSEED", None)
        else:
            os.environ["PYTHONHASHSEED"] = before


def vllm_hashes(
    algo: HashAlgo,
    block_size: int,
    tokens: list[int],
    spans: list[MmSpan],
    salt: str | None,
    lora: tuple[str, str] | None,
    seed: str | None = None,
) -> list[bytes]:
    hash_fn = get_hash_fn_by_name(algo.value)
    with hash_seed(seed):
        kv_cache_utils.init_none_hash(hash_fn)
    features = [
        MultiModalFeatureSpec(
            data=None,
            modality="image",
            identifier=_own(span.identifier),
            mm_position=PlaceholderRange(offset=span.offset, length=span.length),
            mm_hash=_own(span.identifier),
        )
        for span in spans
    ]
    request = Request(
        request_id="r",
        prompt_token_ids=list(tokens),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        mm_features=features or None,
        cache_salt=salt,
        lora_request=LoRARequest(_own(lora[0]), 1, _own(lora[1])) if lora else None,
        block_hasher=kv_cache_utils.get_request_block_hasher(block_size, hash_fn),
    )
    return list(request.block_hashes)


IDENTIFIERS = st.sampled_from(["a" * 64, "b" * 64, "tenant-1:my-uuid", "x"])


@st.composite
def prompts(draw: st.DrawFn) -> tuple[list[int], list[MmSpan]]:
    size = draw(st.integers(0, 150))
    tokens = draw(st.lists(st.integers(0, 2**17), min_size=size, max_size=size))
    spans, at = [], 0
    for _ in range(draw(st.integers(0, 4))):
        if at >= len(tokens):
            break
        # Half the items start or end on a block's edge, or one token off it: where a
        # key's block is decided.
        edges = [e for k in range(1, 10) for e in (16 * k - 1, 16 * k, 16 * k + 1)]
        starts = [e for e in edges if at <= e < len(tokens)]
        anywhere = st.integers(at, len(tokens) - 1)
        offset = draw(st.one_of(anywhere, st.sampled_from(starts)) if starts else anywhere)
        room = min(48, len(tokens) - offset)
        ends = [e - offset for e in edges if 1 <= e - offset <= room]
        sizes = st.integers(1, room)
        length = draw(st.one_of(sizes, st.sampled_from(ends)) if ends else sizes)
        spans.append(MmSpan(draw(IDENTIFIERS), offset, length))
        at = offset + length
    return tokens, spans


@settings(max_examples=150, deadline=None)
@given(
    prompts(),
    st.sampled_from(list(HashAlgo)),
    st.sampled_from([16, 32]),
    st.none() | st.sampled_from(["s", "tenant-a", "ünï"]),
    st.none() | st.just(("adapter", "/loras/adapter")),
)
def test_the_core_names_every_block_as_vllm_does(
    prompt: tuple[list[int], list[MmSpan]],
    algo: HashAlgo,
    block_size: int,
    salt: str | None,
    lora: tuple[str, str] | None,
) -> None:
    tokens, spans = prompt
    theirs = vllm_hashes(algo, block_size, tokens, spans, salt, lora)
    ours = BlockHasher(block_size, algo).hashes(tokens, spans, cache_salt=salt, lora=lora)
    # How often the draw reaches what the keys are about.
    hashed = len(theirs) * block_size
    keyed = [s for s in spans if s.offset < hashed]
    event(f"blocks: {'none' if not theirs else 'some'}")
    event(f"items in a full block: {min(len(keyed), 2)}")
    twice = len({s.identifier for s in keyed}) < len(keyed)
    event(f"one identifier twice in full blocks: {twice}")
    across = any(s.offset // block_size != (s.offset + s.length - 1) // block_size for s in keyed)
    event(f"an item across a block boundary: {across}")
    edge = any(s.offset % block_size == block_size - 1 for s in keyed)
    event(f"an item from a full block's last token: {edge}")
    assert ours == theirs
    assert [external_hash(h) for h in ours] == [
        kv_cache_utils.maybe_convert_block_hash(h) for h in theirs
    ]


@pytest.mark.parametrize("algo", list(HashAlgo))
def test_a_worker_with_pythonhashseed_is_followed_with_the_same_seed(algo: HashAlgo) -> None:
    tokens = list(range(64))
    theirs = vllm_hashes(algo, 16, tokens, [], None, None, seed="1234")
    assert BlockHasher(16, algo, seed="1234").hashes(tokens) == theirs
    assert BlockHasher(16, algo).hashes(tokens) != theirs


def test_what_the_keys_make_differ_does() -> None:
    hasher = BlockHasher(16)
    tokens = list(range(40))
    x, y = MmSpan("x" * 64, 4, 20), MmSpan("y" * 64, 4, 20)
    base = hasher.hashes(tokens, [x])
    assert len(base) == 2
    assert hasher.hashes(tokens, [y])[0] != base[0]  # another image, the same placeholders
    assert hasher.hashes(tokens, [x], cache_salt="t")[0] != base[0]  # another tenant
    moved = hasher.hashes(tokens, [MmSpan("x" * 64, 5, 20)])
    assert moved[0] != base[0]
    # Past its items, a prompt still differs by its chain: block 2 names what came first.
    long = list(range(80))
    assert hasher.hashes(long, [x])[3] != hasher.hashes(long, [y])[3]


def test_what_is_not_a_prompt_is_refused() -> None:
    with pytest.raises(InvalidConfiguration):
        BlockHasher(0)
    with pytest.raises(MalformedRequest):
        MmSpan("", 0, 1)
    with pytest.raises(MalformedRequest):
        MmSpan("a", -1, 1)
    hasher = BlockHasher(16)
    with pytest.raises(MalformedRequest):
        hasher.hashes(list(range(32)), [MmSpan("a", 0, 10), MmSpan("b", 5, 10)])
    with pytest.raises(MalformedRequest):
        hasher.hashes(list(range(32)), [MmSpan("a", 30, 10)])
    for token in (2**32, -1, True, 1.0):
        with pytest.raises(MalformedRequest):
            hasher.hashes([token], [])  # type: ignore[list-item]

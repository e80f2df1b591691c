"""KV-event routing against real ``vllm serve`` prefills: what the proxy predicts a prefill
holds of a request is what that prefill then reports it served from its cache.

The fleet (``kv_fleet.py``, started once for this module on 127.0.0.1 and stopped by
process id): two full-vision tiny LLaVA prefills that publish their KV events and serve
the render route, and a ``--language-model-only`` decode. The proxy runs in this process
with KV routing, recording each lookup (what it predicted, per prefill) and each leg it
sends. A prefill's own count comes back twice: in the handoff it returns
(``remote_prefill_cached_tokens``, which the decode leg carries) and in the client's
``usage.prompt_tokens_details.cached_tokens`` (the decode reports the prefill's count).

The proxy renders each request once: its prefill leg is the lookup's render, token-in, on
the prefill's scale-out generate route (``render_once``), so every prediction checked
here is of blocks a generate leg cached, named as the client's body would name them. Its
answers are a full-vision server's (a prefill sent plain requests): images A, B, A, a
text chat and a completions prompt.

The rule a prediction of ``N`` leading blocks must meet, read in vLLM 0.32
(``KVCacheManager.get_computed_blocks`` caps a hit at ``num_tokens - 1`` tokens: the
last prompt token is always computed, for its logits; the full-attention manager takes
at most ``(num_tokens - 1) // block_size`` leading blocks, stopping at the first it
lacks): a prompt of ``L`` tokens reports ``min(N, (L - 1) // bs) * bs`` cached tokens.

Before a request that counts on what an earlier one cached, the test waits until the
proxy's index holds that request's blocks, named by vLLM's own block hasher: so a wrong
name on the proxy's side fails as a wrong prediction, never as a wait.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import pytest
from fleets import Fleets
from http_peers import InProcessProxy, data_url, fleet_args, http_json
from kv_fleet import PREFILLS, KvFleet, hash_seed, kv_fleet
from live_engines import BLOCK_SIZE
from llava_prompts import TEXT
from router_side import image
from tiny_models import TinyModel
from vllm import SamplingParams
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.request import Request

from pd_policy_vllm.http.cli import read_fleet
from pd_policy_vllm.http.fleet.kv_routing import KvRouting, Lookup
from pd_policy_vllm.http.fleet.members import Fleet, member_name
from pd_policy_vllm.http.fleet.routing import HttpPlacer
from pd_policy_vllm.http.proxy import Proxy
from pd_policy_vllm.http.upstream import Upstream
from pd_policy_vllm.openai.plan.request import Route
from pd_policy_vllm.openai.plan.scale_out import GENERATE

CHAT: Final = "/v1/chat/completions"
COMPLETIONS: Final = "/v1/completions"
WAIT: Final = 30.0


class RecordingKvRouting(KvRouting):
    """KV routing that keeps each lookup's answer, in order (requests run one at a time)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.lookups: list[Lookup | None] = []

    async def lookup(
        self,
        placer: HttpPlacer,
        upstream: Upstream,
        headers: Mapping[str, str],
        tensors: bool | None = None,
    ) -> Lookup | None:
        found = await super().lookup(placer, upstream, headers, tensors)
        self.lookups.append(found)
        return found


@attrs.frozen
class Routed:
    """The fleet behind the proxy, its members as the proxy holds them, the proxy, its
    KV routing, and the model's image placeholder id."""

    fleet: KvFleet
    members: Fleet
    live: InProcessProxy
    kv: RecordingKvRouting
    image_token: int

    def name(self, prefill: str) -> str:
        """The member name of prefill ``p1`` or ``p2``."""
        return member_name(self.fleet.prefills[prefill])


@attrs.frozen
class Served:
    """One request served through the proxy: the prefill it went to (``p1``, ``p2``), what
    the lookup predicted per prefill, its expanded prompt, the prefill's count of cached
    tokens (in its handoff) and the client's (in its usage)."""

    prefill: str
    predicted: dict[str, int]
    tokens: list[int]
    reported: int
    client_cached: int


@pytest.fixture(scope="module")
def kv_http(request: pytest.FixtureRequest, fleets: Fleets, llava: TinyModel) -> KvFleet:
    """The fleet, shared as the session's other fleets are (one runs at a time)."""

    def start() -> Any:
        factory: pytest.TempPathFactory = request.getfixturevalue("tmp_path_factory")
        return kv_fleet(llava, Path(factory.mktemp("kv_http")))

    fleet: KvFleet = fleets.get("kv_http", start, user=request.module.__name__)
    return fleet


@pytest.fixture(scope="module")
def routed(kv_http: KvFleet, llava: TinyModel) -> Iterator[Routed]:
    argv = [f"--prefill={kv_http.prefills[p]}" for p in PREFILLS]
    # Their KV events and block size as the configuration file describes the workers.
    args = fleet_args(*argv, "--decode", kv_http.decode, "--no-mrope", "--kv-routing")
    members = asyncio.run(read_fleet(args))
    assert all(m.worker.kv_events is not None and m.worker.renders for m in members.of("prefill"))
    kv = RecordingKvRouting(seed=hash_seed())
    proxy = Proxy(fleet=members, mrope=False, kv_routing=kv, log_requests=False)
    with InProcessProxy(proxy) as live:
        assert llava.image_token_id is not None
        here = Routed(kv_http, members, live, kv, llava.image_token_id)
        _until(lambda: all(kv.index.synced(here.name(p)) for p in PREFILLS), "both feeds synced")
        yield here


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not {what} after {WAIT:.0f} s"
        time.sleep(0.1)


def chat(seed: int, text: str, *, system: str | None = None) -> dict[str, Any]:
    """A chat body: an optional system prompt, then the user's image ``seed`` and text."""
    picture = {"type": "image_url", "image_url": {"url": data_url(image(seed))}}
    user = {"role": "user", "content": [picture, {"type": "text", "text": text}]}
    messages = ([{"role": "system", "content": system}] if system else []) + [user]
    return {"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0}


def cached_tokens(blocks: int, length: int) -> int:
    """What a worker reports for a prompt of ``length`` whose ``blocks`` leading blocks it
    holds (the module's rule)."""
    return min(blocks, (length - 1) // BLOCK_SIZE) * BLOCK_SIZE


def common_blocks(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading full blocks two prompts (one image at one place) share."""
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    return same // BLOCK_SIZE


def vllm_chain(url: str, body: Mapping[str, Any]) -> list[int]:
    """The block hashes of ``body``'s prompt as vLLM's own hasher names them (rendered on
    the worker at ``url``), as its KV events publish them."""
    status, answer = http_json(f"{url}{CHAT}/render", body)
    assert status == 200, answer
    features = answer.get("features") or {}
    hashes, places = features.get("mm_hashes") or {}, features.get("mm_placeholders") or {}
    specs = [
        MultiModalFeatureSpec(
            data=None,
            modality=modality,
            identifier="".join(list(name)),  # a string of its own, as a served worker's
            mm_position=PlaceholderRange(offset=place["offset"], length=place["length"]),
            mm_hash="".join(list(name)),
        )
        for modality, names in hashes.items()
        for name, place in zip(names, places[modality], strict=True)
    ]
    hash_fn = get_hash_fn_by_name("sha256")
    kv_cache_utils.init_none_hash(hash_fn)  # seeded by PYTHONHASHSEED, as the workers are
    request = Request(
        request_id="reference",
        prompt_token_ids=list(answer["token_ids"]),
        sampling_params=SamplingParams(max_tokens=1),
        pooling_params=None,
        mm_features=specs or None,
        cache_salt=body.get("cache_salt"),
        block_hasher=kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, hash_fn),
    )
    return [kv_cache_utils.maybe_convert_block_hash(h) for h in request.block_hashes]


def indexed(routed: Routed, prefill: str, body: Mapping[str, Any]) -> None:
    """Wait until the proxy's index holds every full block of ``body`` on ``prefill``."""
    chain = vllm_chain(routed.fleet.prefills[prefill], body)
    name = routed.name(prefill)
    assert chain, "a prompt shorter than a block caches nothing"

    def held() -> bool:
        return routed.kv.index.cached([name], chain)[name] == len(chain)

    _until(held, f"{prefill}'s {len(chain)} blocks indexed")


def warm(routed: Routed, prefill: str, body: Mapping[str, Any]) -> int:
    """Run ``body`` on ``prefill`` directly (a client of that worker, not of the proxy),
    wait until the proxy's index holds what it cached; the prompt's length."""
    status, answer = http_json(f"{routed.fleet.prefills[prefill]}{CHAT}", body)
    assert status == 200, answer
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # a fresh prompt
    indexed(routed, prefill, body)
    length: int = answer["usage"]["prompt_tokens"]
    return length


def without_lookup(routed: Routed, body: Mapping[str, Any]) -> str:
    """The prefill the proxy's rules pick for ``body`` when nothing was looked up (its
    media affinity, all members idle)."""
    placer = HttpPlacer(routed.members, body, Route.CHAT, mrope=False, request_id="where")
    chosen = placer(()).prefill.name
    return next(p for p in PREFILLS if routed.name(p) == chosen)


def legs_of(routed: Routed, sent: int) -> tuple[str, Any]:
    """The prefill (``p1``, ``p2``) the legs the proxy sent from ``sent`` on went to, and
    the prefill leg's body: rendered once, it is the lookup's render, token-in, on the
    scale-out generate route."""
    legs = [s for s in routed.live.sent[sent:] if not s.url.endswith("/render")]
    (prefill,) = [p for p in PREFILLS if legs[0].url == routed.fleet.prefills[p] + GENERATE]
    assert legs[0].body["token_ids"] and legs[0].body["sampling_params"]["max_tokens"] == 1
    assert len(legs) == 2 and legs[1].url.startswith(routed.fleet.decode)
    return prefill, legs[0].body


def through(routed: Routed, body: Mapping[str, Any]) -> Served:
    """Send ``body`` through the proxy; what came of it."""
    live, lookups = routed.live, routed.kv.lookups
    sent, looked = len(live.sent), len(lookups)
    status, answer = http_json(live.url + CHAT, body)
    assert status == 200, answer
    prefill, _ = legs_of(routed, sent)
    legs = [s for s in live.sent[sent:] if s.url.endswith(CHAT)]
    assert [leg.url for leg in legs] == [routed.fleet.decode + CHAT]
    handoff = legs[0].body["kv_transfer_params"]
    (lookup,) = lookups[looked:]
    assert lookup is not None, "the request was not looked up"
    predicted = {p: lookup.cached[routed.name(p)] for p in PREFILLS}
    details = answer["usage"]["prompt_tokens_details"]
    tokens = handoff["prompt_token_ids"]
    assert answer["usage"]["prompt_tokens"] == len(tokens)
    reported = handoff["remote_prefill_cached_tokens"]
    return Served(prefill, predicted, tokens, reported, details["cached_tokens"])


def other(prefill: str) -> str:
    return PREFILLS[1 - PREFILLS.index(prefill)]


def test_a_follow_up_goes_to_the_prefill_that_holds_its_image_and_hits_what_was_predicted(
    routed: Routed,
) -> None:
    first = chat(11, f"follow {TEXT}")
    # Cached where the proxy's rules would not send it: only the events can say it is there.
    usual = without_lookup(routed, first)
    holder = other(usual)
    length = warm(routed, holder, first)
    full = length // BLOCK_SIZE

    again = through(routed, first)
    assert again.predicted == {holder: full, usual: 0}
    assert again.prefill == holder
    assert again.reported == again.client_cached == cached_tokens(full, length) > 0

    # The conversation goes on: its first turn is the prompt cached, up to where it ends.
    reply = {"role": "assistant", "content": "the dog sleeps"}
    turn = {"role": "user", "content": "and the cat"}
    longer = through(routed, {**first, "messages": [*first["messages"], reply, turn]})
    shared = min(common_blocks(again.tokens, longer.tokens), full)
    assert shared > 0
    assert longer.predicted == {holder: shared, usual: 0}
    assert longer.prefill == holder
    assert longer.reported == longer.client_cached == cached_tokens(shared, len(longer.tokens))


def test_another_image_behind_the_same_text_shares_no_block(routed: Routed) -> None:
    # The image comes first: every block holds part of it, or follows it.
    warm(routed, "p1", chat(21, f"other {TEXT}"))
    second = chat(22, f"other {TEXT}")
    served = through(routed, second)
    assert served.tokens.index(routed.image_token) < BLOCK_SIZE
    assert served.predicted == {"p1": 0, "p2": 0}
    assert served.reported == served.client_cached == 0
    # This prompt ends on a block's edge: held whole, it is served all but its last block.
    full, rest = divmod(len(served.tokens), BLOCK_SIZE)
    assert rest == 0
    indexed(routed, served.prefill, second)
    again = through(routed, second)
    assert again.predicted == {served.prefill: full, other(served.prefill): 0}
    assert again.prefill == served.prefill
    assert again.reported == again.client_cached == (full - 1) * BLOCK_SIZE


def test_another_image_after_the_same_system_prompt_shares_the_blocks_before_it(
    routed: Routed,
) -> None:
    system = "you describe what each picture shows, briefly and plainly " * 3
    warm(routed, "p2", chat(31, f"system {TEXT}", system=system))
    served = through(routed, chat(32, f"system {TEXT}", system=system))
    # The blocks wholly before the image's placeholders carry no media key: shared.
    before = served.tokens.index(routed.image_token) // BLOCK_SIZE
    assert before >= 2
    assert served.predicted == {"p2": before, "p1": 0}
    assert served.prefill == "p2"
    assert served.reported == served.client_cached == before * BLOCK_SIZE


def test_another_cache_salt_on_the_same_image_shares_nothing_and_its_own_is_found(
    routed: Routed,
) -> None:
    plain = chat(41, f"salted {TEXT}")
    warm(routed, "p1", plain)
    salted = {**plain, "cache_salt": "tenant-b"}
    first = through(routed, salted)
    assert first.predicted == {"p1": 0, "p2": 0}
    assert first.reported == first.client_cached == 0
    # The salt is named as the worker names it: the same salt finds its own blocks.
    indexed(routed, first.prefill, salted)
    again = through(routed, salted)
    full = len(again.tokens) // BLOCK_SIZE
    assert again.predicted == {first.prefill: full, other(first.prefill): 0}
    assert again.prefill == first.prefill
    assert again.reported == again.client_cached == cached_tokens(full, len(again.tokens)) > 0


def tokens(url: str, body: Mapping[str, Any]) -> list[int]:
    """The generated ids of ``body``'s greedy answer from ``url``."""
    status, answer = http_json(url, body)
    assert status == 200, answer
    ids: list[int] = answer["choices"][0]["token_ids"]
    return ids


def test_rendered_once_the_answers_are_a_full_vision_servers(routed: Routed) -> None:
    # A prefill sent plain requests answers as one full-vision server does.
    baseline = routed.fleet.prefills["p1"]
    greedy = {"max_tokens": 8, "temperature": 0, "return_token_ids": True}
    a, b = ({**chat(seed, f"once {TEXT}"), **greedy} for seed in (51, 52))
    text = {"model": "tiny", "messages": [{"role": "user", "content": f"once {TEXT}"}], **greedy}
    prompt = {"model": "tiny", "prompt": f"USER: once {TEXT}\nASSISTANT:", **greedy}
    cases = [(CHAT, a), (CHAT, b), (CHAT, a), (CHAT, text), (COMPLETIONS, prompt)]
    want = [tokens(baseline + route, body) for route, body in cases]
    assert want[0] != want[1]  # else matching them would prove nothing
    for (route, body), expected in zip(cases, want, strict=True):
        sent = len(routed.live.sent)
        assert tokens(routed.live.url + route, body) == expected
        # The prefill got the lookup's render (the image's processed pixels with it), not
        # the client's body.
        _, leg = legs_of(routed, sent)
        pixels = (leg["features"] or {}).get("kwargs_data")
        assert (pixels is not None) == (body is not text and route == CHAT)

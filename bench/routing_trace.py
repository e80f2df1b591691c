"""The routing bench's workload: a seeded multimodal chat trace, and each request's blocks.

The trace is fixed by its seed before any router sees it, and one offered load drives it
for every router. What it holds (``TraceSpec``'s defaults):

- four tenants (applications), three with a ``cache_salt`` of their own and one
  without, sending 40%, 30%, 20% and 10% of the conversations; each has its own system
  prompt (900, 600, 400 and 250 words), which opens every conversation of it: a
  tenant's conversations share a prefix, and no two tenants do;
- 75% of the conversations start with an image in their first user message, drawn from
  40 images with Zipf popularity (exponent 1.1: the top image in about a quarter of
  them); an image is 576 placeholder tokens (LLaVA-1.5's), and stays in every later
  turn's prompt;
- a conversation has 1 + a geometric number of turns (mean 4, at most 12); each turn's
  prompt is the last one, the assistant's answer (60-200 words) and a new question
  (8-40 words): each turn extends the previous one's prefix;
- 32 users in conversation at any time: each request is the next turn of one of them,
  drawn at random, and a user who finished starts a new conversation;
- requests arrive open-loop, as a Poisson process at the offered ``rate``, whatever the
  answers: the gaps between a conversation's turns are the other users' requests.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Sequence
from typing import Any, Final

import attrs

from kv_stub_cache import chain_of
from kv_stub_prompt import Prompt, chat_prompt
from pd_policy.cache.kv_blocks import BlockHasher

__all__ = ["Request", "TraceSpec", "chains", "make_trace", "working_set"]

#: Each request's answer is one token: its latency is its time to first token.
MAX_TOKENS: Final = 1


@attrs.frozen(slots=True)
class TraceSpec:
    """What the trace is made of (see the module docs)."""

    seed: int = 35
    requests: int = 900
    users: int = 32
    tenants: tuple[float, ...] = (0.4, 0.3, 0.2, 0.1)
    system_words: tuple[int, ...] = (900, 600, 400, 250)
    images: int = 40
    zipf: float = 1.1
    image_share: float = 0.75
    image_bytes: int = 3000
    mean_turns: float = 4.0
    max_turns: int = 12
    question_words: tuple[int, int] = (8, 40)
    answer_words: tuple[int, int] = (60, 200)
    vocabulary: int = 5000


@attrs.frozen(slots=True)
class Request:
    """One request of the trace: when it is sent (seconds from the start), whose turn it
    is (``last``: its conversation's last), and its body."""

    at: float
    conversation: int
    turn: int
    last: bool
    tenant: int
    image: int | None
    body: dict[str, Any]


@attrs.define
class _Conversation:
    number: int
    tenant: int
    image: int | None
    turns: int
    messages: list[dict[str, Any]]
    sent: int = 0


def _words(rng: random.Random, spec: TraceSpec, span: tuple[int, int]) -> str:
    return " ".join(f"w{rng.randrange(spec.vocabulary)}" for _ in range(rng.randint(*span)))


def _turns(rng: random.Random, spec: TraceSpec) -> int:
    extra = 0
    while extra + 1 < spec.max_turns and rng.random() > 1 / spec.mean_turns:
        extra += 1
    return 1 + extra


def make_trace(spec: TraceSpec, rate: float) -> list[Request]:
    """The trace of ``spec`` at ``rate`` requests a second (the same bodies at any rate)."""
    rng, clock = random.Random(spec.seed), random.Random(spec.seed + 1)
    systems = [" ".join(f"s{i}w{rng.randrange(spec.vocabulary)}" for _ in range(n))
               for i, n in enumerate(spec.system_words)]  # fmt: skip
    salts = [f"tenant-{i}-{rng.getrandbits(64):016x}" for i in range(len(spec.tenants) - 1)]
    images = [
        "data:image/png;base64," + base64.b64encode(rng.randbytes(spec.image_bytes)).decode()
        for _ in range(spec.images)
    ]
    popularity = [1 / (k + 1) ** spec.zipf for k in range(spec.images)]
    active: list[_Conversation] = []
    out: list[Request] = []
    at, started = 0.0, 0
    while len(out) < spec.requests:
        while len(active) < spec.users:
            tenant = rng.choices(range(len(spec.tenants)), spec.tenants)[0]
            system = systems[tenant]
            image = (rng.choices(range(spec.images), popularity)[0]
                     if rng.random() < spec.image_share else None)  # fmt: skip
            active.append(_Conversation(started, tenant, image, _turns(rng, spec),
                                        [{"role": "system", "content": system}]))  # fmt: skip
            started += 1
        talk = rng.choice(active)
        question: list[dict[str, Any]] = [
            {"type": "text", "text": _words(rng, spec, spec.question_words)}
        ]
        if talk.sent == 0 and talk.image is not None:
            question.insert(0, {"type": "image_url", "image_url": {"url": images[talk.image]}})
        elif talk.sent:
            answer = _words(rng, spec, spec.answer_words)
            talk.messages.append({"role": "assistant", "content": answer})
        talk.messages.append({"role": "user", "content": question})
        body: dict[str, Any] = {"model": "tiny", "messages": list(talk.messages),
                                "max_tokens": MAX_TOKENS, "stream": False}  # fmt: skip
        if talk.tenant < len(salts):
            body["cache_salt"] = salts[talk.tenant]
        at += clock.expovariate(rate)
        talk.sent += 1
        last = talk.sent == talk.turns
        out.append(Request(at, talk.number, talk.sent - 1, last, talk.tenant, talk.image, body))
        if last:
            active.remove(talk)
    return out


def chains(
    trace: Sequence[Request], hasher: BlockHasher, image_tokens: int
) -> list[tuple[Prompt, list[int]]]:
    """Each request's prompt, as the stand-in workers tokenize it, and its block hashes."""
    out = []
    for request in trace:
        prompt, _ = chat_prompt(request.body, image_tokens)
        out.append((prompt, chain_of(hasher, prompt)))
    return out


def working_set(trace: Sequence[Request], blocks: Sequence[Sequence[int]]) -> float:
    """The mean, over the trace, of the blocks the conversations in progress need (each
    one's last prompt, shared blocks once): what the fleet's caches must hold for every
    next turn to find its prefix."""
    latest: dict[int, Sequence[int]] = {}
    sizes = []
    for i, (request, chain) in enumerate(zip(trace, blocks, strict=True)):
        latest[request.conversation] = chain
        if i % 10 == 0:
            sizes.append(len(set().union(*latest.values())))
        if request.last:
            del latest[request.conversation]
    return sum(sizes) / len(sizes) if sizes else 0.0

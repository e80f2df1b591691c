"""KV-event routing against real ``vllm serve`` workers: each policy's prefix hit rate as
the prefills report it, on one small seeded multimodal trace.

The fleet is the live routing test's (``tests/vllm/kv_fleet.py``): two full-vision tiny
LLaVA prefills that publish their KV events (blocks of 32 tokens) and one
``--language-model-only`` decode, on 127.0.0.1. In front of it, ``pd-policy-proxy`` as a
process, once per policy: ``--balance round_robin``; the default (media affinity, then
least outstanding); and ``--kv-routing`` (the prefill that holds the most of a request's
leading blocks, within the load bound, then the default). Every worker's prefix cache is
emptied before each policy (``POST /reset_prefix_cache``).

The trace (seeded): two tenants, each with a system prompt of its own that opens each of
its conversations (one tenant sends a ``cache_salt``); twelve conversations of two to
five turns, nine of them opening on one of four images (a popular few), each turn the
previous prompt, a fixed answer and a new question; four conversations in progress at a
time, their turns interleaved at random. Requests are sent one at a time, a tenth of a
second apart (a user's next turn comes later than the KV events of the last).

Per policy: the prompt tokens, the tokens the prefills served from their caches (each
request's ``usage.prompt_tokens_details.cached_tokens``: the prefill's count, which vLLM
hands to the decode), the hit rate, and how many requests each prefill took. The bound:
what one cache holding every earlier request would serve (each prompt's blocks named by
vLLM's block hasher from its render; a hit never covers a prompt's last token).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Final

import attrs
import render_once_live

from pd_policy.cache.kv_blocks import BlockHasher, MmSpan, external_hash
from pd_policy.tools.tables import splice

#: The generated block of docs/performance.md.
NAME: Final = "performance-routing-live"
HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
SEED: Final = 35
BLOCK: Final = 32
POLICIES: Final = {
    "round robin": ("--balance", "round_robin"),
    "affinity (default)": (),
    "KV routing": ("--kv-routing",),
}
_WORDS: Final = ["describe", "the", "red", "dog", "on", "the", "mat", "and", "blue", "cat"]
_LOG_LINE: Final = re.compile(r"pd_policy_vllm\.http\.requests: (\{.*\})")


def _words(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))


@attrs.define
class _Talk:
    """A conversation of the trace: its tenant, how many turns it has, how many were sent,
    its first user message, and its messages so far."""

    tenant: int
    turns: int
    first: list[dict[str, Any]]
    messages: list[dict[str, Any]]
    sent: int = 0


def make_trace(data_url: Any, image: Any, seed: int = SEED) -> list[dict[str, Any]]:
    """The trace's chat bodies, in the order they are sent (see the module docs);
    ``data_url(image(seed))`` is an image's data URL."""
    rng = random.Random(seed)
    systems = [f"tenant {t}: " + _words(rng, 30, 40) for t in range(2)]
    pictures = [data_url(image(100 + k)) for k in range(4)]
    waiting = []
    for number in range(12):
        tenant = rng.choice((0, 0, 1))
        first: list[dict[str, Any]] = [{"type": "text", "text": _words(rng, 6, 12)}]
        if number % 4 != 3:
            url = rng.choices(pictures, (0.4, 0.3, 0.2, 0.1))[0]
            first.insert(0, {"type": "image_url", "image_url": {"url": url}})
        system = {"role": "system", "content": systems[tenant]}
        waiting.append(_Talk(tenant, rng.randint(2, 5), first, [system]))
    active: list[_Talk] = []
    bodies = []
    while waiting or active:
        while waiting and len(active) < 4:
            active.append(waiting.pop(0))
        talk = rng.choice(active)
        if talk.sent:
            talk.messages.append({"role": "assistant", "content": _words(rng, 8, 16)})
            talk.messages.append({"role": "user", "content": _words(rng, 4, 10)})
        else:
            talk.messages.append({"role": "user", "content": talk.first})
        body = {"model": "tiny", "messages": list(talk.messages), "max_tokens": 4,
                "temperature": 0}  # fmt: skip
        if talk.tenant == 0:
            body["cache_salt"] = "tenant-0"
        bodies.append(body)
        talk.sent += 1
        if talk.sent == talk.turns:
            active.remove(talk)
    return bodies


def post(url: str, body: Any) -> Any:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def one_cache_bound(prefill: str, bodies: Sequence[dict[str, Any]]) -> int:
    """The tokens one cache holding every earlier request of ``bodies`` would serve."""
    hasher, seen, total = BlockHasher(BLOCK), set(), 0
    for body in bodies:
        answer = post(f"{prefill}/v1/chat/completions/render", body)
        features = answer.get("features") or {}
        places = features.get("mm_placeholders") or {}
        items = [
            MmSpan(name, place["offset"], place["length"])
            for modality, names in (features.get("mm_hashes") or {}).items()
            for name, place in zip(names, places[modality], strict=True)
        ]
        ids = answer["token_ids"]
        chain = [
            external_hash(h) for h in hasher.hashes(ids, items, cache_salt=body.get("cache_salt"))
        ]
        held = 0
        while held < len(chain) and chain[held] in seen:
            held += 1
        total += min(held, (len(ids) - 1) // BLOCK) * BLOCK
        seen.update(chain)
    return total


def scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def _counter(text: str, name: str, label: str) -> int:
    found = re.search(rf'^{name}\{{[^}}]*"{label}"[^}}]*\}} (\S+)$', text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


def _synced(text: str, prefills: int) -> bool:
    values = [line.rsplit(" ", 1)[1] for line in text.splitlines()
              if line.startswith("pd_policy_kv_synced{")]  # fmt: skip
    return len(values) == prefills and all(float(v) == 1 for v in values)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _log(fleet: Any, flags: Sequence[str]) -> Path:
    log: Path = fleet.logs / f"proxy{'-'.join(flags)}.log"
    return log


@contextmanager
def running_proxy(fleet: Any, servers: Any, flags: Sequence[str]) -> Iterator[tuple[str, int]]:
    """A ``pd-policy-proxy`` process with ``flags`` in front of ``fleet`` (a
    ``kv_fleet.KvFleet``; ``servers`` is ``tests/vllm/servers.py``), its KV feeds synced
    when it routes by them: its URL and process id while the block runs."""
    argv = ["-m", "pd_policy_vllm.http.cli", "--no-mrope", *flags]
    for prefill in fleet.prefills.values():
        argv += ["--prefill", prefill]
    argv += ["--decode", fleet.decode]
    # Its port the server's to choose (and to choose again, when another process took it).
    server = servers.Server(
        "proxy", lambda ports: [*argv, "--port", str(ports[0])], _log(fleet, flags),
        lambda started: _healthy(started.url), ports=servers.candidate_ports(1),
    )  # fmt: skip
    with servers.running([server]):
        url = server.url
        deadline = time.monotonic() + 30
        while "--kv-routing" in flags and not _synced(scrape(url), len(fleet.prefills)):
            # Both feeds read before the first request.
            assert time.monotonic() < deadline, "the proxy's KV feeds are not synced"
            time.sleep(0.2)
        yield url, server.pid


def run_policy(
    fleet: Any, servers: Any, flags: Sequence[str], bodies: Sequence[Any]
) -> dict[str, Any]:
    """Replay ``bodies`` through a proxy with ``flags`` in front of ``fleet`` (a
    ``kv_fleet.KvFleet``; ``servers`` is ``tests/vllm/servers.py``), its caches emptied
    first; the policy's figures."""
    fleet.reset_prefix_caches()
    with running_proxy(fleet, servers, flags) as (url, _):
        prompt = cached = 0
        began = time.monotonic()
        for body in bodies:
            usage = post(f"{url}/v1/chat/completions", body)["usage"]
            prompt += usage["prompt_tokens"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            time.sleep(0.1)
        seconds = time.monotonic() - began
        metrics = scrape(url)
    log = _log(fleet, flags)
    names = {prefill.rstrip("/"): name for name, prefill in fleet.prefills.items()}
    spread = dict.fromkeys(fleet.prefills, 0)
    for line in log.read_text(errors="replace").splitlines():
        found = _LOG_LINE.search(line)
        if found:
            spread[names[json.loads(found.group(1))["prefill"]]] += 1
    return {"requests": len(bodies), "prompt_tokens": prompt, "cached_tokens": cached,
            "hit_rate": cached / prompt, "spread": spread, "seconds": round(seconds, 1),
            "kv_lookups": {k: _counter(metrics, "pd_policy_kv_routing_total", k)
                           for k in ("hit", "miss", "fallback")}}  # fmt: skip


def measure() -> dict[str, Any]:
    """Start the fleet, replay the trace under each policy; every figure."""
    import tempfile

    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    import http_peers  # type: ignore[import-not-found]
    import kv_fleet  # type: ignore[import-not-found]
    import router_side  # type: ignore[import-not-found]
    import servers  # type: ignore[import-not-found]
    import tiny_models  # type: ignore[import-not-found]

    bodies = make_trace(http_peers.data_url, router_side.image)

    def picture(seed: int) -> str:
        url: str = http_peers.data_url(router_side.image(seed))
        return url

    began = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        model = tiny_models.build_llava(Path(tmp) / "llava")
        # Development mode: each policy's run starts from empty caches (/reset_prefix_cache).
        with kv_fleet.kv_fleet(model, Path(tmp) / "fleet", dev_mode=True) as fleet:
            started = time.monotonic() - began
            bound = one_cache_bound(fleet.prefills["p1"], bodies)
            results = {name: run_policy(fleet, servers, flags, bodies)
                       for name, flags in POLICIES.items()}  # fmt: skip
            proxy = partial(running_proxy, fleet, servers)
            fresh = partial(render_once_live.new_images, bodies, picture)
            traces: dict[str, Callable[[int], Sequence[Any]]] = {
                "the trace": lambda _: bodies, "every image new": fresh,
            }  # fmt: skip
            once = render_once_live.compare(fleet, proxy, traces)
    rates = [results[name]["hit_rate"] for name in POLICIES]
    prompt = results["KV routing"]["prompt_tokens"]
    return {
        "policies": results,
        "one_cache_bound": {"cached_tokens": bound, "hit_rate": bound / prompt},
        "ordered": rates[2] >= rates[1] >= rates[0],
        "startup_seconds": round(started, 1),
        "total_seconds": round(time.monotonic() - began, 1),
        "trace": {"seed": SEED, "requests": len(bodies), "block_size": BLOCK},
        "render_once": once,
    }


def table(results: dict[str, Any]) -> str:
    """The markdown block of docs/performance.md."""
    lines = [
        "| policy | prompt tokens | cached tokens | hit rate | requests on p1 / p2 "
        "| KV lookups hit / miss |",
        "|---|---:|---:|---:|---|---|",
    ]
    for name, row in results["policies"].items():
        spread = " / ".join(str(n) for n in row["spread"].values())
        kv = row["kv_lookups"]
        lookups = f"{kv['hit']} / {kv['miss']}" if name == "KV routing" else "-"
        lines.append(f"| {name} | {row['prompt_tokens']:,} | {row['cached_tokens']:,} | "
                     f"{row['hit_rate']:.1%} | {spread} | {lookups} |")  # fmt: skip
    bound = results["one_cache_bound"]
    lines.append(f"| one cache holding every earlier request (bound) | | "
                 f"{bound['cached_tokens']:,} | {bound['hit_rate']:.1%} | | |")  # fmt: skip
    order = "holds" if results["ordered"] else "does not hold"
    trace = results["trace"]
    lines += ["", f"Two tiny LLaVA prefills (vLLM 0.32 on CPU, prefix caching in blocks of "
              f"{trace['block_size']} tokens, KV events on ZeroMQ) and one language-model-only "
              f"decode; {trace['requests']} chat requests (seed {trace['seed']}: two tenants' "
              "system prompts, four images, conversations of two to five turns), one at a "
              "time, every cache emptied before each policy. Cached tokens: each request's "
              "`cached_tokens`, as its prefill counted it. Sent one at a time, no prefill is "
              "ever loaded past the bound: the spread is where each policy put the requests, "
              "not how it balances load. KV routing ≥ affinity ≥ round "
              f"robin {order}. Model built and workers started in "
              f"{results['startup_seconds']} s; the whole run took "
              f"{results['total_seconds']} s."]  # fmt: skip
    lines += ["", render_once_live.table(results["render_once"])]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/performance.md")
    args = parser.parse_args()
    results = measure()
    (HERE / "routing_live.json").write_text(json.dumps(results, indent=2) + "\n")
    rendered = table(results)
    print(rendered)
    if not args.no_docs:
        doc = ROOT / "docs" / "performance.md"
        doc.write_text(splice(doc.read_text(encoding="utf-8"), NAME, rendered), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

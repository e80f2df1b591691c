"""``make bench-routing``, stand-in fleet part: KV-event routing against round robin, the
proxy's default rules and SMG's ``cache_aware``, on one trace, and an offline oracle.

The fleet is four stand-in prefills and one decode (``tests/kv_stub.py``): each prefill
serves one request at a time, ``BASE_MS`` + ``PER_TOKEN_MS`` per uncached token (10,000
tokens a second: one GPU prefilling a 7-8B model), keeps a bounded LRU prefix cache and
publishes its KV events with vLLM's own publisher; the decode answers at once. Each
prefill's cache holds ``CAPACITY_FACTOR`` / 4 of the trace's working set (the blocks of
the conversations in progress, shared blocks once): the four together hold 1.5 times
it, none holds it alone. The trace (``bench/routing_trace.py``) is replayed open-loop at
the rate at which round robin would keep the prefills busy ``UTILISATION`` of the time,
simulated (``bench/routing_oracle.py``).

Each router gets a fresh stand-in fleet (empty caches, no events before it), and is
ready before the replay: the proxy with ``--kv-routing`` follows every prefill's events
(``pd_policy_kv_synced``), SMG counts every worker healthy. Per router: the prefix hit
rate (cached ÷ prompt tokens, the prefills' own accounting), TTFT p50 and p99 (client
side: a request of one token, not streamed, whose decode answers at once: its latency),
the load imbalance (max ÷ mean requests per prefill) and each prefill's busy share.
A render answers each image's processed tensor as vLLM does unless asked
``mm_payload: "none"`` (``TENSOR_BYTES`` of LLaVA-1.5's pixel values, base64). The
proxies run with ``--no-render-once``: a stand-in processes nothing, so what sending the
prefill leg from the lookup's render saves it cannot show (``bench/routing_live.py``
measures it on live workers). One more run, informative, is the KV router with a looser
load bound (``KV_LOOSE``).
Writes ``bench/routing.json`` and the table of ``docs/performance.md``.

Run: ``python bench/routing.py [--quick] [--no-docs]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Final

HERE: Final = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))  # the stand-ins and their tokenizer

import routing_fleet as fleet  # noqa: E402
from measuring import percentile  # noqa: E402
from routing_oracle import Cost, pooled_lru, simulate  # noqa: E402
from routing_trace import TraceSpec, chains, make_trace, working_set  # noqa: E402

from pd_policy.cache.kv_blocks import BlockHasher  # noqa: E402
from pd_policy.tools.tables import splice  # noqa: E402

NAME: Final = "performance-routing"
PREFILLS, DECODES, BLOCK_SIZE, IMAGE_TOKENS = 4, 1, 16, 576
BASE_MS, PER_TOKEN_MS = 5.0, 0.1
#: What vLLM's render returns per LLaVA-1.5 image by default: float32 pixel values.
TENSOR_BYTES: Final = 3 * 336 * 336 * 4
CAPACITY_FACTOR, UTILISATION, BOUND = 1.5, 0.6, 1.25
KV, SMG = "pd-policy-proxy --kv-routing", "SMG cache_aware"
#: Informative, not a target: the same router with a looser load bound, which the cache's
#: rule obeys too (``--affinity-bound``, 1.25 by default).
KV_LOOSE: Final = "pd-policy-proxy --kv-routing --affinity-bound 2 (informative)"
#: Each router: how it is ready, and its flags.
POLICIES: Final = {
    "pd-policy-proxy --balance round_robin": ("proxy", ["--balance", "round_robin"]),
    "pd-policy-proxy (default: media affinity, bounded)": ("proxy", []),
    KV: ("kv", ["--kv-routing"]),
    SMG: ("smg", []),
    KV_LOOSE: ("kv", ["--kv-routing", "--affinity-bound", "2"]),
}


def plan(spec: TraceSpec) -> dict[str, Any]:
    """The capacities, the rate and the oracles for ``spec``'s trace."""
    hasher = BlockHasher(BLOCK_SIZE)
    items = chains(make_trace(spec, 1.0), hasher, IMAGE_TOKENS)
    blocks = [chain for _, chain in items]
    live = working_set(make_trace(spec, 1.0), blocks)
    capacity = math.ceil(CAPACITY_FACTOR * live / PREFILLS)
    cost = Cost(BASE_MS / 1e3, PER_TOKEN_MS / 1e3, BLOCK_SIZE)
    rate = 10.0
    for _ in range(3):  # round robin's busy time hardly depends on the rate
        arrivals = [r.at for r in make_trace(spec, rate)]
        rr = simulate(items, arrivals, prefills=PREFILLS, capacity=capacity, cost=cost,
                      policy="round_robin")  # fmt: skip
        rate *= UTILISATION / (rr.span / (PREFILLS * arrivals[-1]))
    trace = make_trace(spec, rate)
    arrivals = [r.at for r in trace]
    greedy = simulate(items, arrivals, prefills=PREFILLS, capacity=capacity, cost=cost,
                      policy="greedy", bound=BOUND)  # fmt: skip
    rr = simulate(items, arrivals, prefills=PREFILLS, capacity=capacity, cost=cost,
                  policy="round_robin")  # fmt: skip
    return {
        "trace": trace,
        "setup": {
            "requests": len(trace), "conversations": len({r.conversation for r in trace}),
            "rate": rate, "seconds": arrivals[-1], "capacity_blocks": capacity,
            "working_set_blocks": live, "distinct_blocks": len(set().union(*blocks)),
            "mean_prompt_tokens": statistics.mean(len(p.token_ids) for p, _ in items),
            "image_requests": sum(r.image is not None for r in trace) / len(trace),
            "prefills": PREFILLS, "decodes": DECODES, "block_size": BLOCK_SIZE,
            "image_tokens": IMAGE_TOKENS, "base_ms": BASE_MS, "per_token_ms": PER_TOKEN_MS,
            "tensor_bytes": TENSOR_BYTES, "round_robin_utilisation": UTILISATION,
        },
        "oracle": {
            "pooled_lru": pooled_lru(items, capacity * PREFILLS, BLOCK_SIZE),
            "greedy": greedy.hit_rate,
            "greedy_imbalance": max(greedy.requests) / statistics.mean(greedy.requests),
            "greedy_p50_ms": percentile(list(greedy.latencies), 0.5) * 1e3,
            "round_robin_simulated": rr.hit_rate,
        },
    }  # fmt: skip


def _summary(replayed: fleet.Replayed, stubs: list[dict[str, Any]], metrics: str,
             seconds: float) -> dict[str, Any]:  # fmt: skip
    records = [r for s in stubs for r in s["records"]]
    served = [len(s["records"]) for s in stubs]
    ok = [latency for latency, status in replayed if status == 200]
    outcomes = dict(re.findall(r'^pd_policy_kv_routing_total\{outcome="(\w+)"\} (\S+)$',
                               metrics, re.MULTILINE))  # fmt: skip
    return {
        "hit_rate": sum(r["cached_tokens"] for r in records)
        / max(1, sum(r["prompt_tokens"] for r in records)),
        "ttft_p50_ms": percentile(ok, 0.5) * 1e3 if ok else math.nan,
        "ttft_p99_ms": percentile(ok, 0.99) * 1e3 if ok else math.nan,
        "imbalance": max(served) / statistics.mean(served) if any(served) else math.nan,
        "requests": served,
        "busy": [sum(r["service"] for r in s["records"]) / seconds for s in stubs],
        "queue_wait_ms": statistics.mean(r["queue_wait"] for r in records) * 1e3
        if records
        else math.nan,
        "failed": len(replayed) - len(ok),
        "renders": sum(s["renders"] for s in stubs),
        "kv_routing": {k: float(v) for k, v in outcomes.items()},
    }


async def _run(label: str, kind: str, flags: list[str], planned: dict[str, Any]) -> Any:
    setup = planned["setup"]
    args = ["--prefills", str(PREFILLS), "--decodes", str(DECODES), "--block-size",
            str(BLOCK_SIZE), "--capacity", str(setup["capacity_blocks"]), "--image-tokens",
            str(IMAGE_TOKENS), "--base-ms", str(BASE_MS), "--per-token-ms", str(PER_TOKEN_MS),
            "--tensor-bytes", str(TENSOR_BYTES)]  # fmt: skip
    print(f"{label}: starting the stand-ins and the router", flush=True)
    with fleet.stub_fleet(args) as urls:
        at = fleet.port()
        router = fleet.smg(urls, at) if kind == "smg" else fleet.proxy(urls, at, flags)
        with router as url:
            await fleet.until_ready(url, kind, urls)
            began = time.perf_counter()
            replayed = await fleet.replay(url, planned["trace"], label)
            seconds = time.perf_counter() - began
            stubs, metrics = await fleet.stats(urls), await fleet.metrics(url)
    result = _summary(replayed, stubs, metrics, seconds)
    print(f"{label}: hit rate {result['hit_rate']:.3f}, TTFT p50 {result['ttft_p50_ms']:.0f} "
          f"ms, p99 {result['ttft_p99_ms']:.0f} ms, imbalance {result['imbalance']:.2f}, "
          f"failed {result['failed']}", flush=True)  # fmt: skip
    return result


def targets(results: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    """Each target: what, the measured value, the goal, met."""
    kv, smg, oracle = results["policies"][KV], results["policies"][SMG], results["oracle"]
    return [
        ("KV hit rate ÷ oracle's (perfect-knowledge greedy)", kv["hit_rate"] / oracle["greedy"],
         "≥ 0.9", kv["hit_rate"] >= 0.9 * oracle["greedy"]),
        ("KV hit rate minus SMG cache_aware's", kv["hit_rate"] - smg["hit_rate"], "> 0",
         kv["hit_rate"] > smg["hit_rate"]),
        ("KV TTFT p50 ÷ SMG cache_aware's", kv["ttft_p50_ms"] / smg["ttft_p50_ms"], "≤ 1",
         kv["ttft_p50_ms"] <= smg["ttft_p50_ms"]),
        ("KV load imbalance (max ÷ mean requests per prefill)", kv["imbalance"], "≤ 1.25",
         kv["imbalance"] <= 1.25),
    ]  # fmt: skip


def table(results: dict[str, Any]) -> str:
    """The routers, the oracles and the targets, as markdown."""
    rows = ["| router | prefix hit rate | TTFT p50 | TTFT p99 | imbalance | busy per prefill "
            "| failed |", "|---|---:|---:|---:|---:|---|---:|"]  # fmt: skip
    for label, r in results["policies"].items():
        busy = " / ".join(f"{b:.0%}" for b in r["busy"])
        rows.append(f"| {label} | {r['hit_rate']:.3f} | {r['ttft_p50_ms']:.0f} ms | "
                    f"{r['ttft_p99_ms']:.0f} ms | {r['imbalance']:.2f} | {busy} | "
                    f"{r['failed']} |")  # fmt: skip
    o = results["oracle"]
    rows.append(
        f"| oracle: perfect-knowledge greedy (simulated) | {o['greedy']:.3f} | "
        f"{o['greedy_p50_ms']:.0f} ms (no router) | | {o['greedy_imbalance']:.2f} | | |"
    )
    rows.append(f"| oracle: one pooled LRU of the fleet's capacity | {o['pooled_lru']:.3f} "
                "| | | | | |")  # fmt: skip
    rows += ["", "| target | measured | goal | verdict |", "|---|---:|---|---|"]
    for what, value, goal, met in targets(results):
        rows.append(f"| {what} | {value:.3f} | {goal} | {'met' if met else 'missed'} |")
    s = results["setup"]
    rows += ["", f"{s['requests']} requests ({s['conversations']} conversations, "
             f"{s['image_requests']:.0%} with an image) at {s['rate']:.1f} requests/s over "
             f"{s['seconds']:.0f} s; prompts of {s['mean_prompt_tokens']:.0f} tokens on "
             f"average; each prefill caches {s['capacity_blocks']} blocks of "
             f"{s['block_size']} tokens, the working set is {s['working_set_blocks']:.0f} "
             f"blocks ({s['distinct_blocks']} distinct in the whole trace). Whole run: "
             f"{results['seconds']:.0f} s."]  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    cli = argparse.ArgumentParser(description="KV-event routing on stand-in workers.")
    cli.add_argument("--quick", action="store_true", help="a shorter trace (300 requests)")
    cli.add_argument("--no-docs", action="store_true", help="leave docs/performance.md")
    args = cli.parse_args()
    began = time.perf_counter()
    planned = plan(TraceSpec(requests=300) if args.quick else TraceSpec(requests=1200))
    s = planned["setup"]
    print(
        f"trace: {s['requests']} requests at {s['rate']:.1f}/s, caches of "
        f"{s['capacity_blocks']} blocks; oracle {planned['oracle']}",
        flush=True,
    )
    policies = {label: asyncio.run(_run(label, kind, flags, planned))
                for label, (kind, flags) in POLICIES.items()}  # fmt: skip
    results = {"setup": s, "oracle": planned["oracle"], "policies": policies,
               "seconds": time.perf_counter() - began}  # fmt: skip
    results["targets"] = [{"target": w, "value": v, "goal": g, "met": m}
                          for w, v, g, m in targets(results)]  # fmt: skip
    rendered = table(results)
    print(rendered)
    (HERE / "routing.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if not args.no_docs:
        doc = HERE.parent / "docs" / "performance.md"
        doc.write_text(splice(doc.read_text(encoding="utf-8"), NAME, rendered), "utf-8")


if __name__ == "__main__":
    main()

"""Time to first token of sequential P/D through ``pd-policy-proxy``, by KV connector: vLLM's
``NixlConnector`` (pull), ``NixlPushConnector`` (push) and the project's
``TransferConnector``, on real ``vllm serve`` workers, as ratios to the TransferConnector.

One pair at a time on 127.0.0.1 (the tests' helpers, ``tests/vllm/``): a full-vision tiny
LLaVA prefill and a ``--language-model-only`` decode, the proxy in front as a process,
reading the connector from the workers (no ``--kv-mode``). NIXL runs as the suite runs it,
its progress thread off by the tests' switch (``tests/vllm/nixl_site``); with
``--as-shipped``, pull and push also run with the thread on, NIXL as shipped.

Each pair takes the same requests, one at a time: ``WARMUP`` first (NIXL's handshake is
lazy), then ``REQUESTS`` measured, each the same image and text after a word of its own
(so no request finds another's prefix in a cache), streamed, ``max_tokens`` 4. The time to
first token is the client's: from sending the request to reading the first event that
carries a token. Every answer is checked against the prefill's own (a full server's), and
every NIXL request's transfer in the NIXL metrics of the worker that posts it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from pd_policy.tools.tables import splice

#: The generated block of docs/performance.md.
NAME: Final = "performance-ttft"
HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
WARMUP: Final = 3
REQUESTS: Final = 20
#: The runs, in order: a name, the connector, NIXL's progress thread (``None``: not NIXL).
RUNS: Final = (
    ("TransferConnector", "TransferConnector", None),
    ("NIXL pull, progress thread off", "NixlConnector", "off"),
    ("NIXL push, progress thread off", "NixlPushConnector", "off"),
)
SHIPPED: Final = (
    ("NIXL pull, as shipped", "NixlConnector", "on"),
    ("NIXL push, as shipped", "NixlPushConnector", "on"),
)


def _helpers() -> Any:
    sys.path.insert(0, str(ROOT / "tests" / "vllm"))
    import http_peers  # type: ignore[import-not-found]
    import live_engines  # type: ignore[import-not-found]
    import llava_prompts  # type: ignore[import-not-found]
    import nixl_peers  # type: ignore[import-not-found]
    import router_side  # type: ignore[import-not-found]
    import servers  # type: ignore[import-not-found]
    import tiny_models  # type: ignore[import-not-found]

    return argparse.Namespace(
        http=http_peers, engines=live_engines, prompts=llava_prompts, nixl=nixl_peers,
        side=router_side, servers=servers, models=tiny_models,
    )  # fmt: skip


def body(h: Any, word: str, *, stream: bool) -> dict[str, Any]:
    """The request: its own ``word`` first (no other request's prefix), the image, the text."""
    picture = {"type": "image_url", "image_url": {"url": h.http.data_url(h.side.image(1))}}
    parts = [{"type": "text", "text": word}, picture, {"type": "text", "text": h.prompts.TEXT}]
    return {"model": "tiny", "messages": [{"role": "user", "content": parts}],
            "max_tokens": 4, "temperature": 0, "return_token_ids": True,
            "stream": stream}  # fmt: skip


def first_token(url: str, request: dict[str, Any]) -> tuple[float, list[int]]:
    """Stream ``request`` to ``url``: seconds to the first event that carries a token, and
    every token."""
    call = urllib.request.Request(f"{url}/v1/chat/completions", json.dumps(request).encode(),
                                  {"Content-Type": "application/json"})  # fmt: skip
    began, first, tokens = time.monotonic(), None, []
    with urllib.request.urlopen(call, timeout=300) as response:
        for line in response:
            data = line.strip()[5:].strip() if line.startswith(b"data:") else b""
            if not data or data == b"[DONE]":
                continue
            for choice in json.loads(data).get("choices", []):
                if choice.get("token_ids"):
                    first = first if first is not None else time.monotonic() - began
                    tokens += choice["token_ids"]
    assert first is not None, "the stream carried no token"
    return first, tokens


@contextlib.contextmanager
def progress(value: str | None, switch: str) -> Iterator[None]:
    before = os.environ.get(switch)
    if value is not None:
        os.environ[switch] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(switch, None)
        else:
            os.environ[switch] = before


def run_one(h: Any, model: Any, root: Path, connector: str, thread: str | None) -> dict[str, Any]:
    """Start the pair on ``connector`` (NIXL's progress thread ``thread``), send the
    requests through the proxy; the times and checks."""
    root.mkdir(parents=True)
    if thread is None:
        store = root / "transfers"
        p = h.http.vllm_server("prefill", model, root,
                               kv_config=h.engines.connector("kv_producer", store))  # fmt: skip
        d = h.http.vllm_server("decode", model, root, language_model_only=True,
                               kv_config=h.engines.connector("kv_consumer", store))  # fmt: skip
    else:
        with progress(thread, h.nixl.PROGRESS_THREAD):
            p = h.nixl.nixl_server("prefill", model, root, "kv_producer", connector=connector)
            d = h.nixl.nixl_server("decode", model, root, "kv_consumer", connector=connector,
                                   language_model_only=True)  # fmt: skip
    mover = p if connector == "NixlPushConnector" else d
    times, wrong, untransferred, prompt = [], 0, 0, 0
    with h.servers.running([p, d]):
        x = h.http.proxy(root, p.url, [d.url], "--no-mrope")
        with h.servers.running([x]):
            for i in range(WARMUP + REQUESTS):
                word = f"request {i}"
                before = h.nixl.nixl_counters(mover.url) if thread else None
                seconds, tokens = first_token(x.url, body(h, word, stream=True))
                # Then the prefill as a full server (after: its cache is no help to the P/D).
                plain = body(h, word, stream=False)
                status, full = h.http.http_json(f"{p.url}/v1/chat/completions", plain, timeout=300)
                assert status == 200, full
                wrong += tokens != full["choices"][0]["token_ids"]
                prompt = len(full["prompt_token_ids"])
                if before is not None:
                    deadline = time.monotonic() + 30  # a push prefill counts a step later
                    moved = h.nixl.nixl_counters(mover.url) - before
                    while moved.transfers < 1 and time.monotonic() < deadline:
                        time.sleep(0.05)
                        moved = h.nixl.nixl_counters(mover.url) - before
                    untransferred += moved.transfers < 1 or moved.failed > 0
                if i >= WARMUP:
                    times.append(seconds)
    return {"ttft_ms": [round(t * 1000, 1) for t in times],
            "median_ms": round(statistics.median(times) * 1000, 1),
            "wrong_answers": wrong, "without_transfer": untransferred,
            "prompt_tokens": prompt}  # fmt: skip


def measure(as_shipped: bool) -> dict[str, Any]:
    h = _helpers()
    runs = RUNS + (SHIPPED if as_shipped else ())
    began = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = h.models.build_llava(Path(tmp) / "llava")
        for n, (name, connector, thread) in enumerate(runs):
            results[name] = run_one(h, model, Path(tmp) / f"run{n}", connector, thread)
            print(f"{name}: median {results[name]['median_ms']} ms", flush=True)
    base = results["TransferConnector"]["median_ms"]
    for row in results.values():
        row["ratio"] = round(row["median_ms"] / base, 2)
    return {"runs": results, "requests": REQUESTS, "warmup": WARMUP,
            "total_seconds": round(time.monotonic() - began, 1),
            "load_average": round(os.getloadavg()[0], 1)}  # fmt: skip


def table(results: dict[str, Any]) -> str:
    """The markdown block of docs/performance.md."""
    lines = ["| connector | median time to first token | middle half | ratio to the "
             "TransferConnector | answers equal a full server's | each with a NIXL transfer |",
             "|---|---:|---:|---:|---|---|"]  # fmt: skip
    for name, row in results["runs"].items():
        equal = "all" if not row["wrong_answers"] else f"{row['wrong_answers']} differ"
        without = row["without_transfer"]
        moved = "all" if not without else f"{without} without"
        moved = "-" if name == "TransferConnector" else moved
        times = sorted(row["ttft_ms"])
        half = f"{times[len(times) // 4]:.0f} to {times[3 * len(times) // 4]:.0f} ms"
        lines.append(f"| {name} | {row['median_ms']:.0f} ms | {half} | {row['ratio']:.2f} "
                     f"| {equal} | {moved} |")  # fmt: skip
    prompt = results["runs"]["TransferConnector"]["prompt_tokens"]
    lines += ["", f"Sequential P/D of the tiny LLaVA (one image, {prompt} prompt ids, 4 "
              f"tokens, streamed) through `pd-policy-proxy`, {results['requests']} requests per "
              f"connector after {results['warmup']} to warm up, one pair of `vllm serve` "
              "workers at a time on this 2-core machine, all in one run of "
              f"`make bench-ttft` ({results['total_seconds']} s; the machine's load average "
              f"{results['load_average']} at its end, other work included)."]  # fmt: skip
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--as-shipped", action="store_true",
                        help="also run NIXL with its progress thread on")  # fmt: skip
    parser.add_argument("--no-docs", action="store_true", help="do not rewrite docs/performance.md")
    parser.add_argument("--render", action="store_true",
                        help="render bench/ttft_live.json again, measuring nothing")  # fmt: skip
    args = parser.parse_args()
    saved = HERE / "ttft_live.json"
    if args.render:
        results = json.loads(saved.read_text())
    else:
        results = measure(args.as_shipped)
        saved.write_text(json.dumps(results, indent=2) + "\n")
    rendered = table(results)
    print(rendered)
    if not args.no_docs:
        doc = ROOT / "docs" / "performance.md"
        doc.write_text(splice(doc.read_text(encoding="utf-8"), NAME, rendered), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

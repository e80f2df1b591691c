"""P/D over HTTP on this CPU: ``pd-policy-proxy`` in front of real ``vllm serve`` workers.

``make demo-http`` runs it. It builds the tests' tiny LLaVA (no model hub) and
starts, on 127.0.0.1: a full-vision prefill server (KV producer) and a
``--language-model-only`` decode server (KV consumer) on the transfer
connector, a full-vision baseline server, and the proxy in front of the first
two. It sends images A, B, A through the proxy with the ``openai`` client, next
to the same requests on the baseline; shows what the decode server does with
the original body, as other proxies send it; and three refusals. It prints one
table, then stops every process it started, by process id.

Run: ``python examples/live_http.py`` (in the venv that ``make test`` builds).
About two minutes, most of it the servers starting.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # the model builder and server helpers


def main() -> int:
    import openai
    from http_peers import data_url, http_json, proxy, vllm_server
    from live_engines import connector
    from llava_prompts import TEXT
    from router_side import image
    from servers import running
    from tiny_models import build_llava

    work = Path(tempfile.mkdtemp(prefix="pd-policy-http-demo-"))
    llava = build_llava(work / "llava")
    prefill = vllm_server(
        "prefill", llava, work, kv_config=connector("kv_producer", work / "transfers")
    )
    decode = vllm_server(
        "decode", llava, work, language_model_only=True,
        kv_config=connector("kv_consumer", work / "transfers"),
    )  # fmt: skip
    baseline = vllm_server("baseline", llava, work)
    words = TEXT

    def body(seed: int, **extra: Any) -> dict[str, Any]:
        picture = {"type": "image_url", "image_url": {"url": data_url(image(seed))}}
        text = {"type": "text", "text": words}
        return {"model": "tiny", "messages": [{"role": "user", "content": [picture, text]}],
                "max_tokens": 6, "temperature": 0, **extra}  # fmt: skip

    def tokens(url: str, seed: int, *, stream: bool = False) -> tuple[list[int], dict[str, Any]]:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        request = body(seed)
        extra = {"return_token_ids": True}
        if stream:
            out: list[int] = []
            chunks = client.chat.completions.create(
                model="tiny", messages=request["messages"], max_tokens=6, temperature=0,
                stream=True, extra_body=extra,
            )  # fmt: skip
            for chunk in chunks:
                for choice in chunk.model_dump()["choices"]:
                    out += choice.get("token_ids") or []
            return out, {}
        reply = client.chat.completions.create(
            model="tiny", messages=request["messages"], max_tokens=6, temperature=0,
            extra_body=extra,
        ).model_dump()  # fmt: skip
        return reply["choices"][0]["token_ids"], reply.get("kv_transfer_params") or {}

    rows = [["image", "through the proxy", "baseline server", "same", "KV loaded/cached"]]
    notes = []
    print("starting three vllm serve workers and the proxy (about a minute)...", flush=True)
    with running([prefill, decode, baseline]):
        decode_url, baseline_url = decode.url, baseline.url
        server = proxy(work, prefill.url, [decode_url], "--no-mrope")
        with running([server]):
            proxy_url = server.url
            for name, seed, stream in (("A", 1, False), ("B", 2, False), ("A", 1, True)):
                got, report = tokens(proxy_url, seed, stream=stream)
                want, _ = tokens(baseline_url, seed)
                loaded, cached = report.get("loaded_tokens"), report.get("local_cached_tokens")
                kv = f"{loaded} / {cached}" if report else "(a stream says not)"
                label = name + (", streamed" if stream else "")
                rows.append([label, str(got), str(want), "yes" if got == want else "NO", kv])
            status, reply = http_json(f"{decode_url}/v1/chat/completions", body(1))
            message = reply["error"]["message"].split(" (parameter")[0] if status != 200 else ""
            notes.append(("the original body, straight to the decode server", status, message))
            embeds = {"role": "user", "content": [{"type": "prompt_embeds", "data": "AAAA"}]}
            for label, refused in (
                ("an image with n=2, through the proxy", body(1, n=2)),
                ("an image with cache_salt 'tenant/a', through the proxy",
                 body(1, cache_salt="tenant/a")),
                ("a prompt_embeds part, through the proxy", {"model": "tiny",
                                                             "messages": [embeds]}),
            ):  # fmt: skip
                status, reply = http_json(f"{proxy_url}/v1/chat/completions", refused)
                notes.append((label, status, reply["error"]["code"] if status != 200 else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print("\nP/D over HTTP: vision prefill -> pd-policy-proxy -> --language-model-only decode\n")
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("\nWhat other proxies do (the first), and what the proxy refuses before any worker:")
    for label, status, what in notes:
        print(f"  {label}:\n    HTTP {status} {what}")
    print("\nAll processes stopped; logs in", work)
    ok = all(r[3] == "yes" for r in rows[1:4]) and rows[1][1] != rows[2][1]
    return 0 if ok and all(status == 400 for _, status, _ in notes) else 1


if __name__ == "__main__":
    sys.exit(main())

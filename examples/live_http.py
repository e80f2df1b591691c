"""P/D over HTTP on this CPU: ``pd-policy-proxy`` in front of real ``vllm serve`` workers.

``make demo-http`` runs it. It builds the tests' tiny LLaVA (no model hub) and
starts, on 127.0.0.1: a full-vision prefill server (KV producer) and a
``--language-model-only`` decode server (KV consumer) on vLLM's ``NixlConnector``
(NIXL over UCX, the KV in host memory, as production runs it), and the proxy in front
of them. No worker runs vLLM's development mode: the proxy is told what each is by a
configuration file the demo writes (``[[workers]]``, printed). It sends images A, B, A
through the proxy with the ``openai`` client, next
to the same requests on the prefill server sent plainly (a full-vision server, the
answer to match), with the bytes NIXL moved for each (the decode's ``/metrics``);
shows what the decode server does with the original body, as other proxies send it;
and three refusals. It prints one table, then stops every process it started, by
process id.

NIXL's progress thread is off in these workers, by the tests' switch
(``tests/vllm/nixl_site``): each agent's thread busy-polls a core, which on two cores
makes every request several times slower. ``PD_POLICY_TEST_NIXL_PROGRESS_THREAD=on``
runs NIXL as shipped.

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
    from described import shown
    from http_peers import data_url, http_json, proxy
    from llava_prompts import TEXT
    from nixl_peers import nixl_counters, nixl_note, nixl_server
    from router_side import image
    from servers import running
    from tiny_models import build_llava

    work = Path(tempfile.mkdtemp(prefix="pd-policy-http-demo-"))
    llava = build_llava(work / "llava")
    prefill = nixl_server("prefill", llava, work, "kv_producer")
    decode = nixl_server("decode", llava, work, "kv_consumer", language_model_only=True)
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

    rows = [["image", "through the proxy", "full server", "same", "NIXL moved"]]
    notes = []
    print(nixl_note("two vllm serve workers"), flush=True)
    with running([prefill, decode]):
        decode_url, baseline_url = decode.url, prefill.url
        server = proxy(work, prefill.url, [decode_url], "--no-mrope")
        print(shown(server.command(server.ports)), flush=True)
        with running([server]):
            proxy_url = server.url
            for name, seed, stream in (("A", 1, False), ("B", 2, False), ("A", 1, True)):
                before = nixl_counters(decode_url)
                got, _ = tokens(proxy_url, seed, stream=stream)
                moved = nixl_counters(decode_url) - before
                want, _ = tokens(baseline_url, seed)
                kv = f"{moved.bytes / 1024:.0f} KiB" + (" FAILED" if moved.failed else "")
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
    print("\nP/D over HTTP: vision prefill -> pd-policy-proxy -> --language-model-only decode,")
    print("the KV on vLLM's NixlConnector\n")
    for i, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    print("\nWhat other proxies do (the first), and what the proxy refuses before any worker:")
    for label, status, what in notes:
        print(f"  {label}:\n    HTTP {status} {what}")
    print("\nAll processes stopped; logs in", work)
    ok = all(r[3] == "yes" for r in rows[1:4]) and rows[1][1] != rows[2][1]
    # Each answer's KV came over NIXL: bytes moved, none failed.
    ok = ok and all(r[4] != "0 KiB" and "FAILED" not in r[4] for r in rows[1:4])
    return 0 if ok and all(status == 400 for _, status, _ in notes) else 1


if __name__ == "__main__":
    sys.exit(main())

"""A fleet on this CPU: ``pd-policy-proxy`` over two prefills and two decodes, one killed and
brought back.

``make demo-fleet`` runs it. It builds the tests' tiny LLaVA (no model hub) and starts,
on 127.0.0.1, two full-vision prefill servers (KV producers) and two
``--language-model-only`` decode servers (KV consumers) on vLLM's ``NixlConnector``
(NIXL's progress thread off by the tests' switch; ``PD_POLICY_TEST_NIXL_PROGRESS_THREAD=on``
runs it as shipped), each with ``--api-key``, and the proxy in front of them, which takes
the workers' key from its environment, its clients' from a file and its admin's (for
``/admin/workers``, which no client's key admits) from the environment, and what each
worker is from a configuration file the demo writes (printed): no worker runs vLLM's
development mode. It sends mixed
image and text traffic, kills one decode mid-run, sends more, restarts it and waits until
the proxy routes to it again. The prefills publish their KV events and the proxy routes by them
(``--kv-routing``): a conversation about one image is followed up, and the follow-up
lands on the prefill that holds the image's blocks, which reports them cached. It prints
the answers beside the baseline's (the first prefill, sent plain requests), the spread
of requests over the workers, the conversation's two turns, and an excerpt of
``/metrics``; then stops every process it started, by process id.

Run: ``python examples/live_fleet.py`` (in the venv that ``make test`` builds). About
four minutes, most of it servers starting.
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "vllm"))  # the model builder and server helpers


def main() -> int:
    from described import shown
    from http_peers import data_url
    from llava_prompts import TEXT
    from nixl_peers import nixl_note
    from pool_fleet import ADMIN_KEY, CLIENT_KEY, WORKER_KEY, fleet_proxy, pool_fleet
    from router_side import image
    from servers import running
    from tiny_models import build_llava

    from pd_policy_vllm.http.fleet.members import member_name

    work = Path(tempfile.mkdtemp(prefix="pd-policy-fleet-demo-"))
    llava = build_llava(work / "llava")

    def body(seed: int | None, i: int) -> dict[str, Any]:
        content: list[Any] = [{"type": "text", "text": f"fleet {TEXT}"}]
        if seed is not None:
            content.insert(0, {"type": "image_url", "image_url": {"url": data_url(image(seed))}})
        return {"model": "tiny", "messages": [{"role": "user", "content": content}],
                "max_tokens": 6, "temperature": 0, "return_token_ids": True}  # fmt: skip

    def call(url: str, payload: Any, key: str, path: str = "/v1/chat/completions") -> Any:
        data = None if payload is None else json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        request = urllib.request.Request(url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                raw = response.read()
                return json.loads(raw) if path != "/metrics" else raw.decode()
        except urllib.error.HTTPError as error:
            return {"error": json.loads(error.read())["error"]["code"]}

    def answer(reply: Any) -> str:
        if "error" in reply:
            return f"error {reply['error']}"
        return " ".join(map(str, reply["choices"][0]["token_ids"]))

    def conversation(turns: int) -> dict[str, Any]:
        said = [f"turn {t}: {TEXT}" for t in range(turns)]
        content = [{"type": "image_url", "image_url": {"url": data_url(image(5))}},
                   {"type": "text", "text": " ".join(said)}]  # fmt: skip
        return {"model": "tiny", "messages": [{"role": "user", "content": content}],
                "max_tokens": 4, "temperature": 0}  # fmt: skip

    print(nixl_note("four vllm serve workers"), flush=True)
    with pool_fleet(llava, work / "pool", kv_events=True, nixl=True) as pool:
        server = fleet_proxy(pool, "--kv-routing")
        print(shown(server.command(server.ports)), flush=True)
        with running([server]):
            url = server.url
            seeds = [1, 2, None, 3]
            baseline = {s: answer(call(pool.baseline, body(s, 0), WORKER_KEY)) for s in seeds}
            rows: list[tuple[str, str, str, str]] = []

            def send(phase: str, count: int) -> None:
                def one(i: int) -> tuple[int, Any]:
                    return i, call(url, body(seeds[i % 4], i), CLIENT_KEY)

                with ThreadPoolExecutor(4) as pool_:
                    replies = list(pool_.map(one, range(count)))
                for i, reply in replies:
                    seed = seeds[i % 4]
                    got = answer(reply)
                    same = "same" if got == baseline[seed] else "**DIFFERENT**"
                    rows.append((phase, "text" if seed is None else f"image {seed}", got, same))

            send("all up", 8)
            pool.kill("d2")
            send("d2 killed", 8)
            pool.start("d2", language_model_only=True)
            deadline = time.monotonic() + 60
            d2 = member_name(pool.urls["d2"])
            while time.monotonic() < deadline:
                workers = call(url, None, ADMIN_KEY, "/admin/workers")["workers"]
                if any(w["name"] == d2 and w["health"] == "healthy" for w in workers):
                    break
                time.sleep(1)
            send("d2 back", 8)
            # A conversation about image 5, then its follow-up once the first turn's
            # blocks are in the proxy's index (the prefill's events arrive in a moment).
            turns = [call(url, conversation(1), CLIENT_KEY)]
            time.sleep(2)
            turns.append(call(url, conversation(2), CLIENT_KEY))
            metrics = call(url, None, CLIENT_KEY, "/metrics")
            # Only the admin key adds a worker: an API client's key is refused (403).
            joining = {"role": "decode", "url": pool.urls["d2"]}
            refused = call(url, joining, CLIENT_KEY, "/admin/workers")["error"]
        lines = (pool.root / "fleet-proxy.log").read_text(errors="replace").splitlines()
        spread: collections.Counter[str] = collections.Counter()
        prefills: list[str] = []
        for line in lines:
            _, _, tail = line.partition("pd_policy_vllm.http.requests: ")
            if tail.startswith("{"):
                logged = json.loads(tail)
                prefills.append(logged.get("prefill") or "")
                for role in ("prefill", "decode"):
                    if logged.get(role):
                        spread[f"{role} {logged[role]}"] += 1
        names = {member_name(u): n for n, u in pool.urls.items()}

    print("| phase | request | tokens through the fleet | beside the baseline |")
    print("|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\nRequests per worker (from the proxy's request log):")
    for key, count in sorted(spread.items()):
        role, name = key.split(" ", 1)
        print(f"  {role:8} {names.get(name, name):3} {count}")
    print("\nA conversation about image 5, routed by the prefills' KV events:")
    landed = [names.get(p, p) for p in prefills[-2:]]
    for turn, (reply, where) in enumerate(zip(turns, landed, strict=True), start=1):
        details = reply.get("usage", {}).get("prompt_tokens_details") or {}
        print(f"  turn {turn}: prefill {where}, {details.get('cached_tokens', 0)} prompt "
              f"tokens already cached there")  # fmt: skip
    print(f"\nAn API client's POST /admin/workers: {refused} (only the admin key adds workers)")
    print("\n/metrics (excerpt):")
    for line in metrics.splitlines():
        if line.startswith(("pd_policy_requests_total", "pd_policy_worker_up",
                            "pd_policy_ejections_total", "pd_policy_retries_total",
                            "pd_policy_kv_routing_total", "pd_policy_kv_synced")):  # fmt: skip
            print("  " + line)
    wrong = sum(1 for r in rows if r[3] != "same" and not r[2].startswith("error"))
    followed = landed[0] == landed[1] and all("error" not in reply for reply in turns)
    return 1 if wrong or not followed else 0


if __name__ == "__main__":
    sys.exit(main())

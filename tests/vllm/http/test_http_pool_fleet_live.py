"""``pd-policy-proxy`` over a fleet of real ``vllm serve`` workers, which the tests kill and
restart. (Named apart from the ``test_http_llava_*`` modules, which share another fleet
and must run together.)

The pool (``llava_pool``: two full-vision LLaVA prefills and two ``--language-model-only``
decodes on the ``TransferConnector``, each with ``--api-key``; started once on
127.0.0.1, stopped by process id) behind the proxy as a process, which takes the
workers' key from its environment and its clients' from a file. The first prefill,
sent plain requests, is the full-vision baseline. Every answer must be the baseline's,
whatever the fleet goes through: a decode killed mid-run and brought back as a vision
worker, the proxy itself stopped with SIGTERM.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from http_peers import data_url, http_json
from llava_prompts import TEXT
from pool_fleet import ADMIN_KEY, CLIENT_KEY, WORKER_KEY, Pool, fleet_proxy
from router_side import image
from servers import Server, running

from pd_policy_vllm.http.fleet.members import member_name


@pytest.fixture(scope="module")
def proxy(llava_pool: Pool) -> Iterator[tuple[Server, str]]:
    server = fleet_proxy(llava_pool)
    with running([server]):
        yield server, server.url


def body(seed: int | None, variant: str, **extra: Any) -> dict[str, Any]:
    content: list[Any] = [{"type": "text", "text": f"{variant} {TEXT}"}]
    if seed is not None:
        content.insert(0, {"type": "image_url", "image_url": {"url": data_url(image(seed))}})
    return {"model": "tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 6, "temperature": 0, "return_token_ids": True, **extra}  # fmt: skip


def call(url: str, request: Any, key: str | None, path: str = "/v1/chat/completions",
         method: str | None = None, timeout: float = 120.0) -> tuple[int, Any]:  # fmt: skip
    data = None if request is None else json.dumps(request).encode()
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def tokens(url: str, request: Any, key: str) -> list[int]:
    status, reply = call(url, request, key)
    assert status == 200, reply
    got: list[int] = reply["choices"][0]["token_ids"]
    return got


def routed(pool: Pool, since: int = 0) -> list[dict[str, Any]]:
    """The proxy's request log lines (one JSON object a request), from line ``since``."""
    lines = (pool.root / "fleet-proxy.log").read_text(errors="replace").splitlines()
    out = []
    for line in lines:
        _, _, tail = line.partition("pd_policy_vllm.http.requests: ")
        if tail.startswith("{"):
            out.append(json.loads(tail))
    return out[since:]


def members(url: str) -> dict[str, dict[str, Any]]:
    status, listing = call(url, None, ADMIN_KEY, "/admin/workers")
    assert status == 200, listing
    return {w["name"]: w for w in listing["workers"]}


def wait_for(url: str, name: str, health: str, timeout: float = 240.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        member = members(url)[name]
        if member["health"] == health:
            return member
        time.sleep(0.5)
    raise AssertionError(f"{name} is not {health} after {timeout:.0f} s: {members(url)}")


SEEDS = (1, 2, 3, 4, 5, 6, None)


def expected(pool: Pool, variant: str) -> dict[int | None, list[int]]:
    want = {seed: tokens(pool.baseline, body(seed, variant), WORKER_KEY) for seed in SEEDS}
    assert want[1] != want[2]  # else matching them would prove nothing
    return want


def test_mixed_traffic_through_the_fleet_equals_the_baseline_and_spreads(
    llava_pool: Pool, proxy: tuple[Server, str]
) -> None:
    _, url = proxy
    want = expected(llava_pool, "mix")
    before = len(routed(llava_pool))
    order = [SEEDS[i % len(SEEDS)] for i in range(21)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda s: tokens(url, body(s, "mix"), CLIENT_KEY), order))
    assert got == [want[s] for s in order]
    lines = routed(llava_pool, before)
    names = {n: member_name(llava_pool.urls[n]) for n in llava_pool.urls}
    assert {line["prefill"] for line in lines} == {names["p1"], names["p2"]}
    assert {line["decode"] for line in lines} == {names["d1"], names["d2"]}
    assert all(line["outcome"] == "ok" for line in lines)


def _worker_chats(pool: Pool) -> int:
    logs = [pool.root / f"{n}.log" for n in pool.urls]
    return sum(p.read_text(errors="replace").count("POST /v1/chat/completions") for p in logs)


def _worker_infos(pool: Pool) -> int:
    logs = [pool.root / f"{n}.log" for n in pool.urls]
    return sum(p.read_text(errors="replace").count("GET /server_info") for p in logs)


def test_a_client_without_the_key_is_a_401_and_no_worker_is_called(
    llava_pool: Pool, proxy: tuple[Server, str]
) -> None:
    _, url = proxy
    before = _worker_chats(llava_pool)
    for key in (None, "wrong-key", WORKER_KEY):  # the workers' key is not a client's
        status, reply = call(url, body(1, "key"), key)
        assert status == 401 and reply["error"]["code"] == "pd_unauthorized"
        assert reply["error"]["type"] == "unauthorized" and CLIENT_KEY not in json.dumps(reply)
    # An API client adds no worker: 403, and the worker it names is never described.
    infos = _worker_infos(llava_pool)
    assert infos  # the proxy described each worker at start: the log shows such calls
    join = {"role": "decode", "url": llava_pool.urls["d1"]}
    for key in (CLIENT_KEY, None):
        status, reply = call(url, join, key, "/admin/workers")
        assert status == 403 and reply["error"]["code"] == "pd_forbidden"
    assert _worker_infos(llava_pool) == infos
    # Nor is an admin's key a client's.
    assert call(url, body(1, "key"), ADMIN_KEY)[0] == 401
    assert _worker_chats(llava_pool) == before
    # The workers require theirs: a client that reached one without it would get a 401.
    assert call(llava_pool.urls["d1"], body(None, "key"), None)[0] == 401
    assert call(url, body(1, "key"), CLIENT_KEY)[0] == 200


def test_a_decode_killed_mid_run_is_routed_around_and_comes_back_as_what_it_is_now(
    llava_pool: Pool, proxy: tuple[Server, str]
) -> None:
    # One restart serves both cases: re-admission after a crash, and a worker that comes
    # back as another kind (here with its vision encoder).
    _, url = proxy
    want = expected(llava_pool, "kill")
    order = [SEEDS[i % len(SEEDS)] for i in range(14)]
    results: list[tuple[int | None, list[int]]] = []

    def client() -> None:
        for seed in order:
            results.append((seed, tokens(url, body(seed, "kill"), CLIENT_KEY)))

    d2 = member_name(llava_pool.urls["d2"])
    assert members(url)[d2]["language_model_only"] is True
    runner = threading.Thread(target=client)
    runner.start()
    while len(results) < 3:
        time.sleep(0.1)
    llava_pool.kill("d2")
    runner.join(timeout=600)
    assert not runner.is_alive(), "a client hung"
    assert [tokens_ for _, tokens_ in results] == [want[s] for s, _ in results]
    # Ejected by a failed leg or by the probe, whichever comes first: the client may finish
    # before either when the kill lands while its last requests are on d1.
    wait_for(url, d2, "ejected")
    llava_pool.start("d2", language_model_only=False)
    member = wait_for(url, d2, "healthy")
    deadline = time.monotonic() + 60  # the probe describes it anew within its interval
    while member["language_model_only"] and time.monotonic() < deadline:
        time.sleep(0.5)
        member = members(url)[d2]
    assert member["language_model_only"] is False
    before = len(routed(llava_pool))
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda s: tokens(url, body(s, "kill"), CLIENT_KEY), SEEDS * 2))
    assert got == [want[s] for s in SEEDS * 2]
    forms = {(line["decode"], line["form"]) for line in routed(llava_pool, before)}
    # Back in the rotation, and images to d2 keep their pixels now (a vision decode);
    # d1 still gets the stripped leg.
    assert (d2, "identity_only") in forms
    assert (member_name(llava_pool.urls["d1"]), "text_plus_hashes") in forms


def test_sigterm_drains_the_proxy(llava_pool: Pool, proxy: tuple[Server, str]) -> None:
    server, url = proxy
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body(1, "drain", max_tokens=120, stream=True)).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {CLIENT_KEY}"},
    )
    events: list[bytes] = []
    with urllib.request.urlopen(request, timeout=120) as response:
        events.append(response.readline())
        server.signal(signal.SIGTERM)
        time.sleep(0.5)
        # Not ready at once (a balancer stops sending), alive all the same, while the
        # stream in flight goes on (the pre-stop, then the drain: tests/http/
        # test_http_lifecycle.py holds the listener's close to its time).
        status, ready = http_json(f"{url}/ready")
        assert status == 503 and ready["why_not"][0].startswith("draining"), ready
        assert http_json(f"{url}/health") == (200, {"status": "draining"})
        events += response.read().splitlines()
    assert events[0].startswith(b"data: ") and b"data: [DONE]" in events
    assert server.process is not None
    assert server.process.wait(timeout=60) == 0
    # The workers are untouched: the baseline answers.
    assert http_json(f"{llava_pool.baseline}/health")[0] == 200

"""No error path of the fleet proxy shows a secret: not a client's or the workers' key, not a
worker URL's credentials, not a salt or a media URL. Every body, log line, metric and
admin listing is searched for markers planted in each."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from fleet_stands import Stand, serving

from pd_policy import Support, WorkerCapability
from pd_policy_vllm.http import HttpWorker
from pd_policy_vllm.http.auth import Keys
from pd_policy_vllm.http.fleet.members import Fleet
from pd_policy_vllm.http.proxy import Proxy

MARK = "S3CRETMARK"


def chat(**extra: Any) -> dict[str, Any]:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    return {"model": "tiny", "messages": [{"role": "user", "content": [image, "x"][:1]}],
            "max_tokens": 2, **extra}  # fmt: skip


BODIES: list[tuple[str, Any]] = [
    ("a salt as a list", chat(cache_salt=[f"tenant-{MARK}"])),
    ("a salt as an object", chat(cache_salt={f"tenant-{MARK}": 1})),
    ("a salt vLLM refuses", chat(cache_salt=f"{MARK}/x")),
    ("a salt it takes", chat(cache_salt=f"tenant-{MARK}")),
    ("n>1 on a language-model-only decode", chat(cache_salt=f"tenant-{MARK}", n=2)),
    ("a local file", {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"file:///srv/{MARK}.png"}}]}]}),
    ("a host the worker refuses", {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": f"ftp://{MARK}.example/a.png"}}]}]}),
    ("no messages", {"model": "tiny", "cache_salt": f"tenant-{MARK}"}),
]  # fmt: skip


def test_no_body_log_line_or_metric_shows_a_secret(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []

    async def main() -> None:
        prefill, decode, sick = Stand("p"), Stand("d"), Stand("x")
        prefill.lm_only, sick.fail_next = False, [503] * 50
        async with serving(prefill.app()) as p_url, serving(decode.app()) as d_url, serving(
            sick.app()
        ) as x_url:  # fmt: skip
            fleet = Fleet()
            # Credentials in a worker's URL, as a deployment might write them.
            with_creds = x_url.replace("http://", f"http://admin:{MARK}@")
            fleet.add("prefill", HttpWorker(p_url, WorkerCapability(Support.TRUE)), healthy=True)
            for url in (with_creds, d_url, f"http://user:{MARK}@127.0.0.1:9"):
                fleet.add("decode", HttpWorker(url, WorkerCapability(Support.FALSE)), healthy=True)
            keys = Keys(f"worker-{MARK}", (f"client-{MARK}",), (f"admin-{MARK}",))
            proxy = Proxy(fleet=fleet, mrope=False, keys=keys, admin=True, attempts=3)
            async with serving(proxy.app()) as url, aiohttp.ClientSession() as session:
                bearer = {"Authorization": f"Bearer client-{MARK}"}
                for key in ({}, {"Authorization": f"Bearer {MARK}x"}, bearer):
                    async with session.post(f"{url}/v1/chat/completions", json=chat(),
                                            headers=key) as r:  # fmt: skip
                        seen.append(await r.text())
                for _, body in BODIES:
                    async with session.post(f"{url}/v1/chat/completions", json=body,
                                            headers=bearer) as r:  # fmt: skip
                        seen.append(await r.text())
                for path in ("/metrics", "/admin/workers", "/v1/models"):
                    async with session.get(url + path, headers=bearer) as r:
                        seen.append(await r.text())
                admin = {"Authorization": f"Bearer admin-{MARK}"}
                for key in (bearer, admin):
                    async with session.get(f"{url}/admin/workers", headers=key) as r:
                        seen.append(await r.text())
                    async with session.delete(f"{url}/admin/workers", json={"url": with_creds},
                                              headers=key) as r:  # fmt: skip
                        seen.append(await r.text())
            assert sick.calls or any(c["authorization"] for c in decode.calls)

    asyncio.run(main())
    seen += [record.getMessage() for record in caplog.records]
    seen += [str(record.exc_info) for record in caplog.records if record.exc_info]
    assert len(seen) > len(BODIES) + 6
    leaks = [text for text in seen if MARK in text]
    assert not leaks, leaks[0][:500]

"""The proxy's image (``deploy/Containerfile``), built here by ``scripts/build-image.sh``
and its entrypoint run: as the image's non-root user, serving a request through stand-in
workers, its settings from its environment and its flags."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fleet_stands import Stand, serving
from proxy_process import started
from test_http_fleet import chat
from test_http_lifecycle import _flags, _get, _post

ROOT = Path(__file__).resolve().parents[2]
STORE = ["--storage-driver", "vfs"]


@pytest.fixture(scope="module")
def image() -> str:
    built = subprocess.run(["scripts/build-image.sh", sys.executable], cwd=ROOT, check=True,
                           capture_output=True, text=True, timeout=900)  # fmt: skip
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = subprocess.run(["buildah", *STORE, "from", image], check=True, capture_output=True,
                          text=True, timeout=120).stdout.strip()  # fmt: skip
    try:
        yield name
    finally:
        subprocess.run(["buildah", *STORE, "rm", name], capture_output=True, timeout=120)


def _config(container: str, field: str) -> str:
    return subprocess.run(
        ["buildah", *STORE, "inspect", "--format", "{{" + field + "}}", container],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip


def test_the_image_runs_as_its_non_root_user_with_the_proxy_as_entrypoint(
    container: str,
) -> None:
    assert _config(container, ".OCIv1.Config.Entrypoint") == "[pd-policy-proxy]"
    assert _config(container, ".OCIv1.Config.User") == "10001:10001"
    run = ["buildah", *STORE, "run", "--isolation", "chroot", container, "--"]
    uid = subprocess.run([*run, "id", "-u"], check=True, capture_output=True, text=True,
                         timeout=120).stdout.strip()  # fmt: skip
    assert uid == "10001"
    version = subprocess.run([*run, "pd-policy-proxy", "--version"], check=True,
                             capture_output=True, text=True, timeout=120).stdout  # fmt: skip
    assert version.startswith("pd-policy-proxy ")


@contextlib.asynccontextmanager
async def _entrypoint(container: str, *flags: str) -> AsyncIterator[str]:
    # Chroot isolation shares this machine's network: the proxy binds 127.0.0.1 here.
    argv = ["buildah", *STORE, "run", "--isolation", "chroot", container, "--",
            "pd-policy-proxy", "--host", "127.0.0.1", "--port", "0", *flags]  # fmt: skip
    async with started(argv, timeout=120) as running:
        yield running.url


def test_the_images_proxy_serves_a_request_through_stand_in_workers(container: str) -> None:
    prefill, decode = Stand("p", lm_only=False), Stand("d")

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await stack.enter_async_context(serving(prefill.app()))
            d = await stack.enter_async_context(serving(decode.app()))
            url = await stack.enter_async_context(_entrypoint(container, *_flags(p, d)))
            assert (await _get(f"{url}/ready"))[0] == 200
            assert await _post(url, chat(1)) == 200

    asyncio.run(main())
    assert len(decode.calls) == 1 and "image_url" not in str(decode.calls[0]["body"])

"""The ``--config`` file watched: read again, as on SIGHUP, when it changes.

What is watched is the content, not a time stamp: the file and the keys files the
settings name (``--api-keys-file``, ``--admin-api-keys-file``, ``--worker-api-key-file``)
are hashed every ``--config-watch-seconds``, and a hash that differs from the last one
reloads ([`reload`][pd_policy_vllm.http.reload]). A Kubernetes ConfigMap or Secret
volume swaps a symlink rather than writing the file in place, and a file written twice
within a second keeps its time stamp: both are changes of content. A file that cannot be
read is a change too (the reload refuses it, logged, and the running configuration is
kept); it is tried again only once it changes again.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

__all__ = ["fingerprint", "watched", "watching"]

_log = logging.getLogger("pd_policy_vllm.http")

_KEY_FILES = ("api_keys_file", "admin_api_keys_file", "worker_api_key_file")


def watched(args: argparse.Namespace) -> tuple[Path, ...]:
    """The files whose content ``args`` was read from: its configuration file, then the
    keys files it names (none without a configuration file)."""
    config = getattr(args, "config_path", None)
    if config is None:
        return ()
    keys = (getattr(args, name, None) for name in _KEY_FILES)
    return (Path(config), *(Path(path) for path in keys if path))


def fingerprint(paths: Sequence[Path]) -> bytes:
    """A hash of every file of ``paths``, in order: its name and its content, or why it
    could not be read."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode() + b"\0")
        try:
            digest.update(b"+" + path.read_bytes())
        except OSError as exc:
            digest.update(b"-" + type(exc).__name__.encode())
        digest.update(b"\0")
    return digest.digest()


async def watching(
    args: Callable[[], argparse.Namespace],
    reload: Callable[[], Awaitable[None]],
    interval: float,
) -> None:
    """Every ``interval`` seconds, ``reload`` when a file ``args()`` was read from (the
    settings running now) changed; until cancelled."""
    paths = watched(args())
    last = await asyncio.to_thread(fingerprint, paths)
    while True:
        await asyncio.sleep(interval)
        now = await asyncio.to_thread(fingerprint, paths)
        if now == last:
            continue
        last = now
        _log.info("%s changed: reloading", paths[0])
        await reload()
        if (again := watched(args())) != paths:  # a reload may name other keys files
            paths, last = again, await asyncio.to_thread(fingerprint, again)

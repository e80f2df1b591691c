"""A ``vllm serve`` fleet whose prefills publish their KV events: what KV-event routing
reads, for the live routing test and the live routing bench.

Two full-vision prefills (KV producers) and one ``--language-model-only`` decode (KV
consumer) of one model on the ``TransferConnector``, over one transfer directory, on
127.0.0.1, stopped by process id. Each prefill:

- serves vLLM's scale-out routes (``--enable-scale-out``): the proxy renders a chat
  request on it to learn its expanded prompt;
- caches prefixes (``--enable-prefix-caching``, blocks of ``BLOCK_SIZE``: 32 is a size
  the CPU attention backend takes; its default is 128) with the default ``sha256``
  block hashes, and publishes them on ZeroMQ (``--kv-events-config``: a PUB socket and
  a replay socket, on ports its ``Server`` chooses);
- reports ``usage.prompt_tokens_details.cached_tokens``
  (``--enable-prompt-tokens-details``; the decode too, which then reports the
  prefill's count: vLLM hands it over as ``remote_prefill_cached_tokens``).

The workers run as every test server does (``servers.BASE_ENV``): their model in the
engine core's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which ``vllm serve``
still runs apart from its API server, so the requests reach the block hasher decoded
from the wire, each media identifier a string of its own (see
``pd_policy.cache.kv_blocks``). Their ``PYTHONHASHSEED`` is this process's, if any
(``hash_seed``): it seeds their block hashes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import attrs
from http_peers import http_json, vllm_server
from live_engines import connector
from servers import running
from tiny_models import TinyModel

__all__ = ["PREFILLS", "KvFleet", "hash_seed", "kv_fleet"]

#: The prefills' names, in the order the fleet lists them.
PREFILLS: Final = ("p1", "p2")
_DETAILS: Final = ("--enable-prompt-tokens-details",)
_NO_BLOCK: Final = {"model": "tiny", "prompt": "a", "max_tokens": 1}


def hash_seed() -> str | None:
    """The ``PYTHONHASHSEED`` the workers inherit from this process (``None``: unset)."""
    return os.environ.get("PYTHONHASHSEED")


@attrs.frozen
class KvFleet:
    """The prefills' URLs by name (``p1``, ``p2``), the decode's, where they log, and each
    server's process id by name (``p1``, ``p2``, ``decode``: each leads its process group,
    its engine core among its children)."""

    prefills: dict[str, str]
    decode: str
    logs: Path
    pids: dict[str, int] = attrs.field(factory=dict)

    def reset_prefix_caches(self) -> None:
        """Empty every worker's prefix cache (``POST /reset_prefix_cache``, a dev-mode
        route: the fleet must be started with ``dev_mode``), and have each prefill publish
        it (``AllBlocksCleared``). Raises ``AssertionError`` for a worker that refuses (it
        still holds blocks: a request is running)."""
        for url in (*self.prefills.values(), self.decode):
            status, answer = http_json(f"{url}/reset_prefix_cache", {})
            assert status == 200 and answer == {"success": True}, (url, status, answer)
        for url in self.prefills.values():
            # vLLM publishes a step's events at the end of the step: the reset's event
            # waits for the next one. A prompt shorter than a block runs one, caching nothing.
            status, answer = http_json(f"{url}/v1/completions", _NO_BLOCK)
            assert status == 200, answer


@contextmanager
def kv_fleet(model: TinyModel, root: Path, *, dev_mode: bool = False) -> Iterator[KvFleet]:
    """Start the fleet of ``model`` (logs and transfers under ``root``); stop it after.
    ``dev_mode``: every worker serves vLLM's development routes, and describes itself."""
    root.mkdir(parents=True, exist_ok=True)
    transfers = root / "transfers"
    extra = ("--enable-scale-out", "--enable-prefix-caching", *_DETAILS)
    prefills = {
        name: vllm_server(name, model, root, extra=extra, events=True, dev_mode=dev_mode,
                          kv_config=connector("kv_producer", transfers))
        for name in PREFILLS
    }  # fmt: skip
    decode = vllm_server(
        "decode", model, root, language_model_only=True, dev_mode=dev_mode,
        kv_config=connector("kv_consumer", transfers), extra=_DETAILS,
    )  # fmt: skip
    with running([*prefills.values(), decode]):
        pids = {name: s.pid for name, s in [*prefills.items(), ("decode", decode)]}
        yield KvFleet({name: s.url for name, s in prefills.items()}, decode.url, root, pids)

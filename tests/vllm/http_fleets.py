"""The ``vllm serve`` fleet of one tiny model that its P/D and E/P/D modules share.

Four workers on 127.0.0.1, stopped by process id:

- a full-vision prefill (KV producer). Sent a plain chat request, it answers as one
  full-vision server does: it is also the baseline the answers must match (it stores
  KV only for a request that asks);
- a ``--language-model-only`` decode (KV consumer) that takes both prefills' KV: the
  ``TransferConnector`` loads a transfer by its id, so the two prefills share one
  transfer directory without ever meeting;
- an encoder (encoder-cache producer) and an E/P/D prefill (encoder-cache consumer and
  KV producer), over a fresh encoder store: vLLM's example connector looks items up
  on disk by hash alone, so a stale store would answer silently.

``scale_out`` puts ``--enable-scale-out`` on the prefill and the decode too (the
M-RoPE metadata path); the encoder and the E/P/D prefill always have it. No worker runs
vLLM's development mode but, with ``epd_dev_mode``, the encoder and the E/P/D prefill:
their encoder-cache roles (``ec_transfer_config``) are then read from their own
``/server_info``, which is the only place that says them (a configuration file has no key
for it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs
from http_peers import vllm_server
from nixl_peers import kv_worker
from servers import running
from tiny_models import TinyModel

from pd_policy import EncoderCacheRole
from pd_policy_vllm import ec_transfer_config

__all__ = ["HttpFleet", "PdFleet", "http_fleet", "pd_fleet"]

_SCALE_OUT = ("--enable-scale-out",)


@attrs.frozen
class HttpFleet:
    """The URLs of one model's four workers, and the encoder store's directory."""

    prefill: str
    decode: str
    encoder: str
    epd_prefill: str
    #: The encoder cache: one directory per item hash.
    store: Path
    #: Where the servers log.
    logs: Path
    scale_out: bool
    #: The KV goes over vLLM's ``NixlConnector``, not the ``TransferConnector``.
    nixl: bool = False

    @property
    def baseline(self) -> str:
        """A full-vision server to match: the prefill, sent plain requests."""
        return self.prefill


@contextmanager
def http_fleet(
    model: TinyModel, root: Path, *, scale_out: bool, limits: dict[str, int],
    prefill_extra: tuple[str, ...] = (), nixl: bool = False, epd_dev_mode: bool = False,
) -> Iterator[HttpFleet]:  # fmt: skip
    """Start the four workers of ``model`` (logs, stores and transfers under ``root``);
    ``prefill_extra`` are more flags for the plain prefill. ``nixl``: the KV goes over
    vLLM's ``NixlConnector`` (both prefills are NIXL producers the decode reads), not the
    ``TransferConnector``. ``epd_dev_mode``: the encoder and the E/P/D prefill describe
    themselves."""
    root.mkdir(parents=True, exist_ok=True)
    store, transfers = root / "encoder-cache", root / "transfers"
    plain = _SCALE_OUT if scale_out else ()

    def ec(role: EncoderCacheRole) -> tuple[str, ...]:
        return ("--ec-transfer-config", json.dumps(ec_transfer_config(role, store)))

    p = kv_worker("prefill", model, root, "kv_producer", nixl=nixl, transfers=transfers,
                  limits=limits, extra=(*plain, *prefill_extra))  # fmt: skip
    d = kv_worker("decode", model, root, "kv_consumer", nixl=nixl, transfers=transfers,
                  language_model_only=True, extra=plain)  # fmt: skip
    e = vllm_server("encoder", model, root, limits=limits, dev_mode=epd_dev_mode,
                    extra=(*_SCALE_OUT, *ec(EncoderCacheRole.PRODUCER)))  # fmt: skip
    q = kv_worker(
        "epd-prefill", model, root, "kv_producer", nixl=nixl, transfers=transfers, limits=limits,
        extra=(*_SCALE_OUT, *ec(EncoderCacheRole.CONSUMER)), dev_mode=epd_dev_mode,
    )  # fmt: skip
    with running([p, d, e, q]):
        yield HttpFleet(p.url, d.url, e.url, q.url, store, root, scale_out, nixl)


@attrs.frozen
class PdFleet:
    """The URLs of a P/D pair: a full-media prefill (also the baseline) and a
    ``--language-model-only`` decode."""

    prefill: str
    decode: str
    logs: Path

    @property
    def baseline(self) -> str:
        """A full server to match: the prefill, sent plain requests."""
        return self.prefill


@contextmanager
def pd_fleet(
    model: TinyModel, root: Path, *, limits: dict[str, int], nixl: bool = False
) -> Iterator[PdFleet]:
    """Start a P/D pair of ``model``: two servers, for a model no other path runs; on
    vLLM's ``NixlConnector`` when ``nixl``."""
    root.mkdir(parents=True, exist_ok=True)
    transfers = root / "transfers"
    p = kv_worker("prefill", model, root, "kv_producer", nixl=nixl, transfers=transfers,
                  limits=limits)  # fmt: skip
    d = kv_worker("decode", model, root, "kv_consumer", nixl=nixl, transfers=transfers,
                  language_model_only=True)  # fmt: skip
    with running([p, d]):
        yield PdFleet(p.url, d.url, root)

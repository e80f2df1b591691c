"""A KV connector that follows the ``kv_transfer_params`` handoff contract, on CPU.

**For testing and developing P/D without GPUs, not for production**: transfers
go through a local directory, synchronously, and are never cleaned up.

The contract it follows is the one NIXL follows, which the P/D policy relies on:

* a prefill request tagged ``{"do_remote_decode": true}`` is stored under a
  transfer id, and the engine returns parameters *naming that transfer*
  (``transfer_id``, ``do_remote_prefill``, the prompt's length and digest, and
  the engine's own multimodal identifiers);
* a decode request carrying those parameters loads exactly that transfer and
  no other, whatever multimodal features its prompt has or lacks. A stripped,
  language-model-only decode leg has none, which is why vLLM's
  ``ExampleConnector`` (keyed by token ids *and* multimodal identifiers) misses
  and silently recomputes an image-blind answer.

Design points, each found the hard way on vLLM 0.32 CPU:

* **The partial last block moves too.** The decode engine computes whatever
  the connector does not load, and a language-model-only engine computes an
  image placeholder as the *text* embedding of its id. So the load covers every
  prompt token but the last (which decode must compute for its logits).
* **Whole blocks are copied.** The CPU attention backend lays a block out as
  all keys then all values, so per-token slicing of a block is wrong; a block
  copy is layout-agnostic. The tail of a partial block past the load is
  overwritten by decode's own forward.
* **The worker side reads everything from per-step metadata.** Engines in one
  process share a single worker-side connector (vLLM keeps it in a process
  global), so it may not hold any engine's settings.
* **The decode side reports what it did** in its own output's
  ``kv_transfer_params``: ``loaded_tokens`` (from the transfer) and
  ``local_cached_tokens`` (from its own prefix cache), so a caller can verify
  the handoff and observe prefix-cache isolation. vLLM's ``num_cached_tokens``
  adds the two together.

Register it like any out-of-tree connector::

    kv_transfer_config={
        "kv_connector": "TransferConnector",
        "kv_connector_module_path": "pd_policy_vllm.transfer_connector",
        "kv_role": "kv_producer",  # or "kv_consumer", or "kv_both"
        "kv_connector_extra_config": {"transfer_dir": "/some/dir"},
    }

Extra config: ``transfer_dir`` (required); ``partial_blocks`` (default true;
false moves whole blocks only, to show why the tail matters); ``return_params``
(default true; false stores the transfer but returns no parameters, like an
outdated prefill servicer, to exercise the policy's 502).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .blocks import prompt_digest
from .connector import CONNECTOR_NAME, TransferConnector

__all__ = ["CONNECTOR_NAME", "TransferConnector", "kv_transfer_config", "prompt_digest"]


def kv_transfer_config(
    role: str,
    transfer_dir: str | Path,
    *,
    partial_blocks: bool = True,
    return_params: bool = True,
) -> dict[str, Any]:
    """The ``kv_transfer_config`` that plugs this connector into an engine.

    ``role`` is ``"kv_producer"`` (prefill), ``"kv_consumer"`` (decode) or
    ``"kv_both"``. In one process every engine needs a connector once any has
    one (vLLM keeps the worker-side connector in a process global): give the
    others an inert ``"kv_producer"``, which stores nothing unless asked.
    """
    return {
        "kv_connector": CONNECTOR_NAME,
        "kv_connector_module_path": __name__,
        "kv_role": role,
        "kv_connector_extra_config": {
            "transfer_dir": str(transfer_dir),
            "partial_blocks": partial_blocks,
            "return_params": return_params,
        },
    }

"""The prefill leg: the request as the router built it, safe for the engine, tagged for the
handoff.

The prefill worker has the vision encoder, so its leg keeps every pixel,
tensor and media reference. Only what the handoff needs changes: one sample,
the connector's tag, and every M-RoPE grid kept on CPU (the prefill engine
loses a grid that is not, once the same image is prefix-cached).
"""

from __future__ import annotations

import attrs

from .batch import MultimodalBatch
from .connectors import KvHandoff
from .mrope import grids_kept_on_cpu
from .request import Request

__all__ = ["prefill_batch", "prefill_leg"]


def prefill_batch(batch: MultimodalBatch) -> MultimodalBatch:
    """``batch`` with every M-RoPE grid it carries listed in ``keep_on_cpu_keys``.

    Everything else, pixels included, is kept; a batch that lists them all
    already is returned as is.
    """
    listed = batch.keep_on_cpu_keys
    missing = tuple(k for k in grids_kept_on_cpu(batch, batch.tensor_names) if k not in listed)
    return attrs.evolve(batch, keep_on_cpu_keys=listed + missing) if missing else batch


def prefill_leg(request: Request, handoff: KvHandoff) -> Request:
    """The prefill leg of ``request`` under ``handoff``.

    One sample (``n=1``); the KV parameters ``handoff.prefill_params`` when it
    tags the leg, the request's own otherwise; every batch through
    [`prefill_batch`][pd_policy.prefill.prefill_batch]. The input is never changed. Raises
    ``ValueError``
    for a handoff that runs no prefill (n>1).
    """
    if not handoff.runs_prefill:
        raise ValueError("this handoff runs no prefill leg (n>1: decode runs alone)")
    batches = tuple(prefill_batch(b) for b in request.batches)
    params = (
        request.kv_transfer_params if handoff.prefill_params is None else handoff.prefill_params
    )
    return request._derive_trusted(n=1, batches=batches, kv_transfer_params=params)

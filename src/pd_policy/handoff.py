"""The KV handoff between the legs: relaying prefill's parameters, and checking they came."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .decision import DecodeForm
from .errors import MalformedRequest, MissingKvTransferParams
from .request import LegacyKvParams, Request, kv_params_text

__all__ = ["check_kv_handoff", "ensure_kv_handoff", "relay_kv"]


def relay_kv(
    leg: Request,
    kv_transfer_params: str | Mapping[str, Any] | None = None,
    kv_legacy: LegacyKvParams | None = None,
) -> Request:
    """The decode leg carrying the KV parameters the prefill leg returned.

    The handoff has a single consumer, so nothing is relayed when ``leg.n > 1``.
    Parameters the prefill did not return leave the leg's own (if any) in place.
    Raises [`MalformedRequest`][pd_policy.errors.MalformedRequest] if the parameters are
    not a JSON object.
    """
    if not leg.relays_kv or (kv_transfer_params is None and kv_legacy is None):
        return leg
    changes: dict[str, Any] = {}
    if kv_transfer_params is not None:
        changes["kv_transfer_params"] = kv_params_text(kv_transfer_params)
    if kv_legacy is not None:
        if not isinstance(kv_legacy, LegacyKvParams):
            raise MalformedRequest("kv_legacy must be LegacyKvParams", param="kv_legacy")
        changes["kv_legacy"] = kv_legacy
    # Only these fields change, each checked as the constructor checks it: the rest of
    # the leg was validated when it was made.
    return leg._derive_trusted(**changes)


def ensure_kv_handoff(original: Request, form: DecodeForm, leg: Request) -> None:
    """The post-prefill check: refuse a stripped multimodal leg that has no KV handoff.

    Fires when the leg (after [`relay_kv`][pd_policy.handoff.relay_kv]) carries neither KV parameter
    form and either the form is ``TEXT_PLUS_HASHES`` and the original request
    has multimodal batches (decode would recompute the prompt as text and
    answer image-blind), or the form is ``MROPE_METADATA`` (decode would have
    to encode the image, with no encoder). A text request keeps the
    local-recompute fallback.

    Raises [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams] (502,
    non-retryable).
    """
    check_kv_handoff(
        form,
        has_mm_inputs=original.has_mm_inputs,
        has_kv_transfer_params=leg.has_kv_transfer_params,
    )


def check_kv_handoff(
    form: DecodeForm, *, has_mm_inputs: bool, has_kv_transfer_params: bool
) -> None:
    """The check of [`ensure_kv_handoff`][pd_policy.handoff.ensure_kv_handoff], over the facts it
    reads.

    Adapters that read the facts off a wire message call this, so the rule has
    one implementation. Raises
    [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams].
    """
    if has_kv_transfer_params:
        return
    if (form is DecodeForm.TEXT_PLUS_HASHES and has_mm_inputs) or form is DecodeForm.MROPE_METADATA:
        raise MissingKvTransferParams()

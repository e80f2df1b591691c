"""The KV handoff between the legs: relaying prefill's parameters, and checking they came."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .connectors import KvConnectorMode
from .decision import DecodeForm
from .errors import MalformedRequest, MissingKvTransferParams
from .handoff_fields import missing_kv_fields
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


def ensure_kv_handoff(
    original: Request, form: DecodeForm, leg: Request, mode: KvConnectorMode
) -> None:
    """The post-prefill check: refuse a stripped multimodal leg with no complete KV handoff.

    Fires when the leg (after [`relay_kv`][pd_policy.handoff.relay_kv]) carries no
    handoff that names its transfer under ``mode`` (the fields of
    [`REQUIRED_KV_FIELDS`][pd_policy.handoff_fields.REQUIRED_KV_FIELDS]: ``{}`` or a
    NIXL handoff without its block ids is none) and either the form is
    ``TEXT_PLUS_HASHES`` and the original request has multimodal batches (decode
    would recompute the prompt as text and answer image-blind), or the form is
    ``MROPE_METADATA`` (decode would have to encode the image, with no encoder). A
    text request keeps the local-recompute fallback, whatever its handoff holds.

    Raises [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams] (502,
    non-retryable), naming the missing fields (never their values).
    """
    legacy = leg.kv_legacy
    check_kv_handoff(
        form,
        has_mm_inputs=original.has_mm_inputs,
        kv_transfer_params=leg.kv_transfer_params,
        kv_legacy=(legacy.remote_host, legacy.remote_port) if legacy is not None else None,
        mode=mode,
    )


def check_kv_handoff(
    form: DecodeForm,
    *,
    has_mm_inputs: bool,
    kv_transfer_params: str | Mapping[str, Any] | None,
    kv_legacy: tuple[str, int] | None,
    mode: KvConnectorMode,
) -> None:
    """The check of [`ensure_kv_handoff`][pd_policy.handoff.ensure_kv_handoff], over the facts it
    reads: the leg's JSON parameters (an object or its text) and its typed legacy
    ``(remote_host, remote_port)``, as
    [`missing_kv_fields`][pd_policy.handoff_fields.missing_kv_fields] reads them.

    Adapters that read the facts off a wire message call this, so the rule has
    one implementation. Raises
    [`MissingKvTransferParams`][pd_policy.errors.MissingKvTransferParams].
    """
    if (form is DecodeForm.TEXT_PLUS_HASHES and has_mm_inputs) or form is DecodeForm.MROPE_METADATA:
        _refuse_incomplete(mode, kv_transfer_params, kv_legacy)


def _refuse_incomplete(
    mode: KvConnectorMode,
    kv_transfer_params: str | Mapping[str, Any] | None,
    kv_legacy: tuple[str, int] | None,
) -> None:
    missing = missing_kv_fields(mode, kv_transfer_params, kv_legacy)
    if missing is None:
        raise MissingKvTransferParams()
    if missing:
        raise MissingKvTransferParams(
            f"the prefill worker's kv_transfer_params for this multimodal request lack "
            f"{', '.join(missing)} ({mode.value} connector): the language-model-only decode "
            "worker would recompute the prompt image-blind"
        )

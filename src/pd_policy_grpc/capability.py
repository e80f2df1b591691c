"""A worker's capability from its ``GetModelInfo`` and ``GetServerInfo`` answers."""

from __future__ import annotations

from pd_policy import (
    MM_MEDIA_REF_SCHEMES_LABEL,
    MM_PROCESSOR_LABEL,
    SUPPORTS_VISION_LABEL,
    VisionSupport,
    WorkerCapability,
)

from .wire import pb

__all__ = ["capability_from_info", "capability_from_labels", "worker_labels"]


def _schemes(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def capability_from_info(
    model_info: pb.GetModelInfoResponse,
    server_info: pb.GetServerInfoResponse | None = None,
    *,
    reports_supports_vision: bool = True,
) -> WorkerCapability:
    """The capability a worker's info responses advertise.

    ``supports_vision`` is a plain proto3 bool, so an unset field reads false.
    A servicer with the honest probe (SMG PR #2640 and later) sets it on
    purpose; pass ``reports_supports_vision=False`` for a worker that does not,
    so it stays ``UNKNOWN`` (treated as vision-capable) instead of being taken
    for a language-model-only worker. The media-processor fields come from
    ``server_info`` when given.
    """
    support = (
        VisionSupport.from_bool(model_info.supports_vision)
        if reports_supports_vision
        else VisionSupport.UNKNOWN
    )
    if server_info is None:
        return WorkerCapability(support)
    return WorkerCapability(
        support, server_info.mm_processor, _schemes(server_info.mm_media_ref_schemes)
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
    return labels


def capability_from_labels(labels: dict[str, str]) -> WorkerCapability:
    """The capability a gateway's label map describes (see ``WorkerCapability.from_labels``)."""
    return WorkerCapability.from_labels(labels)

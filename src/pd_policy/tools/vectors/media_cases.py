"""The conformance cases of media identity: the basis rule over every source, what makes two
items one (the bytes, the uuid, every hash factor), and the worker's URL rules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from pd_policy.media.identity import MediaSource

__all__ = ["media_cases"]

_DIGEST: Final = "9f" * 32
_WORKER_RULES: Final = {"allowed_domains": ["media.example"], "allowed_local_path": "/srv/media"}


def media_cases(add: Callable[..., None]) -> None:
    """Append the cases, through ``add(case_id, description, operation, **fields)``."""
    for source in MediaSource:
        for has_uuid in (False, True):
            for pinned, worker in ((False, False), (True, False), (False, True)):
                name = f"{source.value}{'/uuid' if has_uuid else ''}"
                name += "/pinned" if pinned else "/worker" if worker else ""
                add(
                    f"media_identity/basis/{name}",
                    "the basis of an item's identity",
                    "media_identity",
                    modality="image",
                    source=source.value,
                    has_uuid=has_uuid,
                    pinned=pinned,
                    worker=worker,
                    value=_DIGEST,
                )
    image = {"modality": "image", "source": "inline", "value": _DIGEST}
    variants: dict[str, dict[str, object]] = {
        "plain": {},
        "video": {"modality": "video"},
        "other_bytes": {"value": "8e" * 32},
        "uuid_equal_to_the_digest": {"has_uuid": True},
        "processor_option": {"factors": {"processor_kwargs": {"do_normalize": False}}},
        "processor_option_reordered": {"factors": {"processor_kwargs": {"b": 2, "a": 1}}},
        "processor_option_ordered": {"factors": {"processor_kwargs": {"a": 1, "b": 2}}},
        "media_option": {"factors": {"media_io_kwargs": {"image_mode": "L"}}},
        "worker_processor_option": {
            "factors": {"worker_processor_kwargs": {"do_normalize": False}}
        },
        "worker_media_option": {"factors": {"worker_media_io_kwargs": {"num_frames": 8}}},
        "empty_option": {"factors": {"processor_kwargs": {}}},
    }
    for name, changes in variants.items():
        add(
            f"media_identity/same_or_not/{name}",
            "what makes two items one",
            "media_identity",
            **{**image, **changes},
        )
    add(
        "media_identity/named_without_uuid",
        "an item with no data and no uuid",
        "media_identity",
        modality="audio",
        source="named",
        value="x",
    )
    add(
        "media_identity/empty_value",
        "an identity needs a value",
        "media_identity",
        **{**image, "value": ""},
    )
    urls = {
        "data": "data:image/png;base64,AAAA",
        "https_allowed": "https://media.example/a.png?sig=secret",
        "https_other_host": "https://evil.example/a.png",
        "https_subdomain": "https://cdn.media.example/a.png",
        "ftp": "ftp://media.example/a.png",
        "file_inside": "file:///srv/media/a.png",
        "file_traversal": "file:///srv/media/../etc/passwd",
        "file_outside": "file:///etc/passwd",
    }
    for name, url in urls.items():
        add(
            f"check_media_url/{name}",
            "a media URL against the worker's rules",
            "check_media_url",
            url=url,
            rules=_WORKER_RULES,
        )
    add(
        "check_media_url/file_default_rules",
        "vLLM's defaults read no local file",
        "check_media_url",
        url=urls["file_inside"],
    )
